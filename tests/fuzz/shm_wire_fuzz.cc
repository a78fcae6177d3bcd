// libFuzzer target for the shm backend's control-message decoder (transfer/shm/shm_wire.h): the
// bytes a same-host peer sends over the UNIX socket are untrusted like any other.
//
// Besides "no crash, no sanitizer report": a frame that decodes never claims more bytes than it was
// given, re-encodes (with the type's encoder) to exactly the bytes it consumed, and decoding a
// strict prefix of it reports "incomplete" (ok, consumed 0) rather than an error or a frame.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "transfer/shm/shm_wire.h"

namespace {

using namespace pdr::transfer::shm;

std::string reencode(const Frame& f) {
  switch (f.type) {
    case MsgType::kHello: return encode_hello(f.text);
    case MsgType::kRegionQuery: return encode_region_query(f.region_id);
    case MsgType::kRegion: return encode_region(f.region);
    case MsgType::kRegionsEnd: return encode_regions_end(f.region_id);
    case MsgType::kNotify: return encode_notify(f.seq, f.text);
    case MsgType::kNotifyAck: return encode_notify_ack(f.seq);
    case MsgType::kRegionRevoke: return encode_region_revoke(f.region_id);
    case MsgType::kRevokeAck: return encode_revoke_ack(f.region_id);
  }
  __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  Frame frame;
  std::size_t consumed = 0;
  if (!decode_frame(bytes, &frame, &consumed).is_ok() || consumed == 0) return 0;
  if (consumed > size) __builtin_trap();
  const std::string again = reencode(frame);
  if (again.size() != consumed || std::memcmp(again.data(), data, consumed) != 0) __builtin_trap();
  Frame prefix;
  std::size_t prefix_consumed = 1;
  if (!decode_frame(bytes.first(consumed - 1), &prefix, &prefix_consumed).is_ok() ||
      prefix_consumed != 0) {
    __builtin_trap();
  }
  return 0;
}
