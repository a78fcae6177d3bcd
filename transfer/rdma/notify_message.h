// The small messages the RDMA backend SENDs on QP 0 of a connection (docs/design/kv-transfer.md R-13 option B):
// the initiator's NOTIFY after every data WR of a task completed, and the target's REPLY once the
// notification was handed to its engine. Pure codec, no verbs.
//
// Layout (little-endian): u8 type (1 NOTIFY, 2 REPLY), u8 status (0 ok), u16 zero, u32 message
// length, u64 xfer_id, then the message bytes (a REPLY carries none). The whole SEND is one
// message: its byte length must be exactly header + message length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace pdr::transfer::rdma {

inline constexpr std::size_t kNotifyHeaderBytes = 16;

enum class NotifyType : std::uint8_t { kNotify = 1, kReply = 2 };

struct NotifyMessage {
  NotifyType type = NotifyType::kNotify;
  std::uint8_t status = 0;
  std::uint64_t xfer_id = 0;
  std::string_view message;  // points into the decoded bytes
};

// Writes the message into `out` and returns the bytes used, or 0 when `out` is too small.
std::size_t encode_notify_message(const NotifyMessage& message, std::span<std::byte> out);

// false for anything but a well-formed message of a known type.
bool decode_notify_message(std::span<const std::byte> bytes, NotifyMessage* out);

}  // namespace pdr::transfer::rdma
