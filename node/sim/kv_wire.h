// The `pdnode sim` KV side channel's messages (one ZMQ message each; node/sim/kv_channel.h).
//
// A decode contacts its prefill's side channel (where the dialect's real connector would: MoRIIO
// handshake port, NIXL remote_host:remote_port, P2P-NCCL kv port, Mooncake worker address from the
// bootstrap /query, SGLang bootstrap port) with:
//   kDescribe       -> kDescriptor: the prefill engine's descriptor (transfer/engine.h
//                      export_local()) and its KV layout id and shape;
//   kWriteRequest   -> kAck: WRITE mode: "write the blocks of `key` into these blocks of my
//                      layout, notify me with `key`"; carries the decode's own descriptor.
// Any request may be answered kError (message says why).
//
// Encoding: "PDKV", version 1, type byte, then the type's fields: integers little-endian, strings
// as u32 length + bytes, block ids as u32 count + u32 each. decode_kv_message() refuses anything
// that does not match exactly (wrong magic/version/type, truncated, trailing bytes, a field over
// its limit below) with a reason; it never reads out of bounds nor allocates beyond the limits.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pdr::node::sim {

inline constexpr size_t kMaxKvMessageBytes = 1 << 20;
inline constexpr size_t kMaxKvKeyBytes = 1024;
inline constexpr size_t kMaxKvDescriptorBytes = 256 << 10;
inline constexpr size_t kMaxKvErrorBytes = 4096;
inline constexpr uint32_t kMaxKvBlocksPerMessage = 65536;

enum class KvMessageType : uint8_t {
  kDescribe = 1,
  kDescriptor = 2,
  kWriteRequest = 3,
  kAck = 4,
  kError = 5,
};

struct KvMessage {
  KvMessageType type = KvMessageType::kDescribe;
  std::string key;                 // kWriteRequest
  std::string descriptor;          // kDescriptor, kWriteRequest: Engine::export_local() bytes
  uint32_t layout = 0;             // kDescriptor, kWriteRequest: the sender's layout id
  uint64_t block_bytes = 0;        // kDescriptor, kWriteRequest
  uint32_t layers = 0;             // kDescriptor, kWriteRequest
  std::vector<uint32_t> blocks;    // kWriteRequest: the sender's block ids, in logical order
  std::string error;               // kError
};

std::string encode_kv_message(const KvMessage& message);

// nullopt on success, else why the bytes were refused.
std::optional<std::string> decode_kv_message(std::string_view bytes, KvMessage* out);

}  // namespace pdr::node::sim
