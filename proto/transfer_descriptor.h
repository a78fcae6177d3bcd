// The transfer engine's local descriptor: what one engine tells a peer about itself so the peer can
// reach it and address its memory (docs/design/kv-transfer.md, Engine API, "Descriptor"; exportLocal() /
// importPeer()). The router carries it opaquely (kv_transfer_params, bootstrap), so it is compact
// msgpack and is decoded from untrusted bytes under explicit limits. Pure functions; no I/O.
//
// Wire shape: one msgpack map with string keys. Unknown keys are ignored (forward compatibility);
// list items are positional arrays, and extra trailing items in them are ignored for the same
// reason.
//   v         u32, required   schema major version; 1..kTransferDescriptorMajor (newer: refused)
//   v_minor   u32, optional   schema minor version (additions a v-1 reader may ignore); default 0
//   agent     str, required   agent name, 1..max_string_bytes
//   hostname  str, required   host identity for same-host detection (SHM backend, S-5), together
//   boot_id   str, required   with the kernel boot id; either may be empty (then never "same host")
//   endpoints array, required [[backend "tcp"|"shm"|"rdma", address str (non-empty)], ...]
//   regions   array, required [[id u32, length u64, kind "dram"|"vram"], ...], ids unique
//   layouts   array, required [[id u32, region_id u32, block_bytes u64, stride u64,
//                               block_count u32, layers u32, layer_stride u64
//                               (, base_offset u64: optional, written only when non-zero)], ...],
//                             ids unique
//   rkeys     array, optional [[region_id u32, keys bin], ...]: RDMA remote keys per region, opaque
//                             to this codec (the RDMA backend packs them), region ids unique
//   secret    bin, optional   (since v1.1) the engine's random per-engine secret, exactly
//                             kTransferSecretBytes: a TCP peer must prove it knows it (HMAC over a
//                             server nonce, proto/transfer_frame.h) before any data op is served.
//                             Whoever holds the descriptor can read and write the regions it lists:
//                             carry it only over channels you trust as much as the memory itself.
//                             A v1.0 reader ignores the key; a v1.1 TCP backend refuses a peer
//                             whose descriptor has none.
//
// Layout geometry: block b of layer l starts at byte base_offset + l * layer_stride + b * stride of
// its region and spans block_bytes. A layout is valid when block_bytes, block_count and layers are
// >= 1 and, without 64-bit overflow, base_offset + (layers - 1) * layer_stride +
// (block_count - 1) * stride + block_bytes and base_offset + layers * layer_stride are both <= the
// region's length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"

namespace pdr::proto {

inline constexpr uint32_t kTransferDescriptorMajor = 1;
inline constexpr uint32_t kTransferDescriptorMinor = 1;  // 1: the optional "secret" key
inline constexpr size_t kTransferSecretBytes = 32;

enum class EndpointBackend : uint8_t { kTcp, kShm, kRdma };
enum class RegionKind : uint8_t { kDram, kVram };

// Wire names: "tcp", "shm", "rdma"; "dram", "vram".
std::string_view to_string(EndpointBackend);
std::string_view to_string(RegionKind);
bool parse_endpoint_backend(std::string_view, EndpointBackend*);
bool parse_region_kind(std::string_view, RegionKind*);

struct DescriptorEndpoint {
  EndpointBackend backend = EndpointBackend::kTcp;
  std::string address;  // backend-specific ("host:port", a UNIX socket path, ...), not parsed here
  friend bool operator==(const DescriptorEndpoint&, const DescriptorEndpoint&) = default;
};

struct DescriptorRegion {
  uint32_t id = 0;
  uint64_t length = 0;
  RegionKind kind = RegionKind::kDram;
  friend bool operator==(const DescriptorRegion&, const DescriptorRegion&) = default;
};

struct DescriptorLayout {
  uint32_t id = 0;
  uint32_t region_id = 0;
  uint64_t block_bytes = 0;
  uint64_t stride = 0;
  uint32_t block_count = 0;
  uint32_t layers = 0;
  uint64_t layer_stride = 0;
  uint64_t base_offset = 0;
  friend bool operator==(const DescriptorLayout&, const DescriptorLayout&) = default;
};

struct DescriptorRkeys {
  uint32_t region_id = 0;
  std::string keys;  // opaque bytes (msgpack bin on the wire)
  friend bool operator==(const DescriptorRkeys&, const DescriptorRkeys&) = default;
};

struct TransferDescriptor {
  uint32_t version_major = kTransferDescriptorMajor;  // encode writes these as given
  uint32_t version_minor = kTransferDescriptorMinor;
  std::string agent;
  std::string hostname;
  std::string boot_id;
  std::vector<DescriptorEndpoint> endpoints;
  std::vector<DescriptorRegion> regions;
  std::vector<DescriptorLayout> layouts;
  std::vector<DescriptorRkeys> rkeys;  // empty: the key is left out
  std::string secret;  // empty (the key is left out) or exactly kTransferSecretBytes raw bytes
  friend bool operator==(const TransferDescriptor&, const TransferDescriptor&) = default;
};

struct DescriptorLimits {
  size_t max_bytes = 16 * 1024;  // whole encoded descriptor
  size_t max_endpoints = 16;
  size_t max_regions = 64;
  size_t max_layouts = 64;
  size_t max_string_bytes = 256;  // agent, hostname, boot_id, endpoint addresses
  size_t max_rkey_bytes = 256;    // one region's rkeys blob
};

// The first byte past the layout's last block, relative to its base_offset, i.e.
// (layers - 1) * layer_stride + (block_count - 1) * stride + block_bytes. false when a count is 0
// or the arithmetic overflows 64 bits.
bool layout_extent(const DescriptorLayout& layout, uint64_t* extent);

// The checks decode_descriptor() runs after parsing, usable on a locally built descriptor before
// encoding it: version, string sizes, list sizes, ids unique, every layout and rkeys entry names an
// existing region, every layout fits in its region. Errors name the item:
//   kRejected      "descriptor major version 2 is newer than supported 1"
//   kOutOfRange    "v 0 is out of range 1..4294967295"
//   kInvalidValue  "agent must not be empty", "endpoints[1].address must not be empty",
//                  "layouts[0] block_count must be at least 1"
//   kTooLarge      "regions has 65 items, limit 64", "agent is 300 bytes, limit 256",
//                  "rkeys[0].keys is 300 bytes, limit 256"
//   kMalformed     "regions[3].id 7 is not unique", "layouts[0].region_id 9 names no region"
//   kInvalidValue  "secret is 5 bytes, must be 32"
//   kOutOfRange    "layouts[0] extent overflows 64 bits",
//                  "layouts[0] needs 8192 bytes, region 1 has 4096"
Status validate_descriptor(const TransferDescriptor& descriptor, const DescriptorLimits& limits);

// Encodes `descriptor` as the map above (fixed key order; integers in their smallest msgpack form;
// rkeys and secret only when non-empty). Does not validate: run validate_descriptor() first on anything built
// locally, or the peer will refuse it.
std::string encode_descriptor(const TransferDescriptor& descriptor);

// Decodes and validates a descriptor from untrusted bytes. Besides validate_descriptor()'s errors:
//   kTooLarge/kTooDeep/kMalformed  size limits, invalid or truncated msgpack, trailing bytes
//   kWrongType    "descriptor must be a map", "regions[0] must be an array, got int",
//                 "secret must be bin, got str"
//                 "endpoints[0].backend must be a string, got int"
//   kMissingKey   "agent is required for a transfer descriptor"
//   kMalformed    "regions[0] has 2 items, expected at least 3"
//   kInvalidValue "endpoints[0].backend 'udp' is not tcp, shm or rdma"
//   kOutOfRange   "layouts[0].block_count 4294967296 is out of range 0..4294967295"
// On failure *out is left in an unspecified but valid state.
Status decode_descriptor(std::span<const std::byte> bytes, const DescriptorLimits& limits,
                         TransferDescriptor* out);

}  // namespace pdr::proto
