// Notify/reply message codec (contract: notify_message.h).
#include "transfer/rdma/notify_message.h"

#include <cstring>

namespace pdr::transfer::rdma {

namespace {

void put_le(std::byte* out, std::uint64_t value, std::size_t bytes) {
  for (std::size_t i = 0; i < bytes; ++i) out[i] = static_cast<std::byte>(value >> (8 * i) & 0xff);
}

std::uint64_t get_le(const std::byte* in, std::size_t bytes) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < bytes; ++i) {
    value |= std::uint64_t{std::to_integer<std::uint8_t>(in[i])} << (8 * i);
  }
  return value;
}

}  // namespace

std::size_t encode_notify_message(const NotifyMessage& message, std::span<std::byte> out) {
  const std::size_t size = kNotifyHeaderBytes + message.message.size();
  if (out.size() < size || message.message.size() > UINT32_MAX) return 0;
  std::byte* p = out.data();
  put_le(p, static_cast<std::uint8_t>(message.type), 1);
  put_le(p + 1, message.status, 1);
  put_le(p + 2, 0, 2);
  put_le(p + 4, message.message.size(), 4);
  put_le(p + 8, message.xfer_id, 8);
  if (!message.message.empty()) {
    std::memcpy(p + kNotifyHeaderBytes, message.message.data(), message.message.size());
  }
  return size;
}

bool decode_notify_message(std::span<const std::byte> bytes, NotifyMessage* out) {
  if (bytes.size() < kNotifyHeaderBytes) return false;
  const std::byte* p = bytes.data();
  const auto type = static_cast<std::uint8_t>(get_le(p, 1));
  if (type != static_cast<std::uint8_t>(NotifyType::kNotify) &&
      type != static_cast<std::uint8_t>(NotifyType::kReply)) {
    return false;
  }
  if (get_le(p + 2, 2) != 0) return false;
  const std::uint64_t length = get_le(p + 4, 4);
  if (length != bytes.size() - kNotifyHeaderBytes) return false;
  out->type = static_cast<NotifyType>(type);
  out->status = static_cast<std::uint8_t>(get_le(p + 1, 1));
  out->xfer_id = get_le(p + 8, 8);
  out->message = std::string_view(reinterpret_cast<const char*>(p + kNotifyHeaderBytes), length);
  return true;
}

}  // namespace pdr::transfer::rdma
