// Notify/reply message codec (contract: notify_message.h).
#include "transfer/rdma/notify_message.h"

#include "proto/little_endian.h"

#include <cstring>

namespace pdr::transfer::rdma {

std::size_t encode_notify_message(const NotifyMessage& message, std::span<std::byte> out) {
  const std::size_t size = kNotifyHeaderBytes + message.message.size();
  if (out.size() < size || message.message.size() > UINT32_MAX) return 0;
  std::byte* p = out.data();
  proto::put_le<std::uint8_t>(p, static_cast<std::uint8_t>(message.type));
  proto::put_le<std::uint8_t>(p + 1, static_cast<std::uint8_t>(message.status));
  proto::put_le<std::uint16_t>(p + 2, 0);
  proto::put_le<std::uint32_t>(p + 4, static_cast<std::uint32_t>(message.message.size()));
  proto::put_le<std::uint64_t>(p + 8, message.xfer_id);
  if (!message.message.empty()) {
    std::memcpy(p + kNotifyHeaderBytes, message.message.data(), message.message.size());
  }
  return size;
}

bool decode_notify_message(std::span<const std::byte> bytes, NotifyMessage* out) {
  if (bytes.size() < kNotifyHeaderBytes) return false;
  const std::byte* p = bytes.data();
  const auto type = (proto::get_le<std::uint8_t>(p));
  if (type != static_cast<std::uint8_t>(NotifyType::kNotify) &&
      type != static_cast<std::uint8_t>(NotifyType::kReply)) {
    return false;
  }
  if (proto::get_le<std::uint16_t>(p + 2) != 0) return false;
  const std::uint64_t length = proto::get_le<std::uint32_t>(p + 4);
  if (length != bytes.size() - kNotifyHeaderBytes) return false;
  out->type = static_cast<NotifyType>(type);
  out->status = (proto::get_le<std::uint8_t>(p + 1));
  out->xfer_id = proto::get_le<std::uint64_t>(p + 8);
  out->message = std::string_view(reinterpret_cast<const char*>(p + kNotifyHeaderBytes), length);
  return true;
}

}  // namespace pdr::transfer::rdma
