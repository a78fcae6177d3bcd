// The shm backend's control protocol over its UNIX socket: pure encode/decode over byte spans, no
// I/O (docs/design/README.md, Conventions). Data never travels here; only the handshake, region announcements (with the
// memfd attached out of band as SCM_RIGHTS) and notifications.
//
// Frame: an 8-byte header {u16 magic 0x5053 "PS", u16 type, u32 body_len} (little endian), then
// body_len bytes. Every body has a fixed size or a bounded one, checked before anything is used:
//   kHello        client -> server   agent name, 1..kMaxAgentBytes
//   kRegionQuery  client -> server   {u32 region_id}; the server answers kRegion (if it serves that
//                                    region) then kRegionsEnd{region_id}
//   kRegion       server -> client   {u32 id, u32 flags, u64 length, u64 addr}; flags: exactly one
//                                    of kRegionHasFd (one fd rides with the frame's first byte) or
//                                    kRegionCma (addr is the region's address in the server)
//   kRegionsEnd   server -> client   {u32 region_id} closes one answer (0: the answer to kHello,
//                                    which lists every region); answers come in request order
//   kNotify       client -> server   {u64 seq, message 0..kMaxNotifyBytes}
//   kNotifyAck    server -> client   {u64 seq}, sent after on_notification() returned
//   kRegionRevoke server -> client   {u32 region_id}: a region announced by address (kRegionCma)
//                                    was unregistered; the client drops it, waits for its copies
//                                    in progress and answers kRevokeAck (region revocation)
//   kRevokeAck    client -> server   {u32 region_id}: nothing of ours touches that address any more
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "proto/base/status.h"

namespace pdr::transfer::shm {

inline constexpr std::uint16_t kFrameMagic = 0x5053;
inline constexpr std::size_t kFrameHeaderBytes = 8;
inline constexpr std::size_t kMaxAgentBytes = 256;
inline constexpr std::size_t kMaxNotifyBytes = 64 * 1024;
inline constexpr std::size_t kMaxBodyBytes = 8 + kMaxNotifyBytes;

inline constexpr std::uint32_t kRegionHasFd = 1u << 0;
inline constexpr std::uint32_t kRegionCma = 1u << 1;

enum class MsgType : std::uint16_t {
  kHello = 1,
  kRegionQuery = 2,
  kRegion = 3,
  kRegionsEnd = 4,
  kNotify = 5,
  kNotifyAck = 6,
  kRegionRevoke = 7,
  kRevokeAck = 8,
};

struct RegionInfo {
  std::uint32_t id = 0;
  std::uint32_t flags = 0;
  std::uint64_t length = 0;
  std::uint64_t addr = 0;  // kRegionCma only; 0 otherwise
};

// One decoded frame. Only the fields of its type are meaningful; `text` views into the input span.
struct Frame {
  MsgType type = MsgType::kHello;
  std::string_view text;        // kHello agent, kNotify message
  std::uint32_t region_id = 0;  // kRegionQuery, kRegionsEnd, kRegionRevoke, kRevokeAck
  std::uint64_t seq = 0;        // kNotify, kNotifyAck
  RegionInfo region;            // kRegion
};

std::string encode_hello(std::string_view agent);
std::string encode_region_query(std::uint32_t region_id);
std::string encode_region(const RegionInfo& region);
std::string encode_regions_end(std::uint32_t region_id);
std::string encode_notify(std::uint64_t seq, std::string_view message);
std::string encode_notify_ack(std::uint64_t seq);
std::string encode_region_revoke(std::uint32_t region_id);
std::string encode_revoke_ack(std::uint32_t region_id);

// Decodes the first frame of `bytes`. ok with *consumed == 0: incomplete, read more. ok with
// *consumed > 0: *out holds a frame of that many bytes. An error (kMalformed bad magic or body,
// kTooLarge body_len, kUnknownType type) means the stream is unusable: close the connection.
Status decode_frame(std::span<const std::byte> bytes, Frame* out, std::size_t* consumed);

}  // namespace pdr::transfer::shm
