// The RDMA backend's out-of-band connection record and per-region key blob (docs/design/kv-transfer.md R-4).
// Pure codecs over byte spans; no I/O. Both decoders take untrusted bytes and bound every field.
//
// Handshake record (little-endian, fixed order; each side sends one over the control socket,
// framed by a u32 length prefix of at most kRdmaHandshakeMaxBytes):
//   u16 magic 0x4852 ("RH")  u8 version (1)
//   u8  gid[16]              the GID the QPs use (RoCE) or zero (IB with LID routing)
//   u16 lid                  u8 port_num (>= 1)   u8 path_mtu (IBV_MTU_256=1 .. IBV_MTU_4096=5)
//   u8  gid_type (0 IB/unknown, 1 RoCE v1, 2 RoCE v2)   u8 max_rd_atomic (>= 1)
//   u8  qp_count K (1..kRdmaMaxQps)   u16 agent_len (1..kRdmaMaxAgentBytes)
//   u32 qpn[K]  u32 psn[K]   (each a 24-bit value; PSNs are random per QP, as rc_pingpong does)
//   agent bytes              the sender's agent name (the "from" of its notifications)
// The record has no optional parts: its size must be exactly what the header implies.
//
// Region key blob (the opaque DescriptorRkeys::keys of one region, 13 bytes):
//   u8 version (1)  u32 rkey  u64 addr   (addr: the MR's remote virtual address for offset 0)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "proto/base/status.h"

namespace pdr::proto {

inline constexpr uint16_t kRdmaHandshakeMagic = 0x4852;
inline constexpr uint8_t kRdmaHandshakeVersion = 1;
inline constexpr size_t kRdmaMaxQps = 64;
inline constexpr size_t kRdmaMaxAgentBytes = 256;
inline constexpr size_t kRdmaHandshakeHeaderBytes = 2 + 1 + 16 + 2 + 1 + 1 + 1 + 1 + 1 + 2;
inline constexpr size_t kRdmaHandshakeMaxBytes =
    kRdmaHandshakeHeaderBytes + 8 * kRdmaMaxQps + kRdmaMaxAgentBytes;
inline constexpr uint32_t kRdmaMax24Bit = 0xffffff;
inline constexpr size_t kRdmaRegionKeyBytes = 13;

struct RdmaHandshake {
  std::array<uint8_t, 16> gid{};
  uint16_t lid = 0;
  uint8_t port_num = 1;
  uint8_t path_mtu = 5;
  uint8_t gid_type = 0;
  uint8_t max_rd_atomic = 1;
  std::vector<uint32_t> qpn;  // qpn.size() == psn.size() == K
  std::vector<uint32_t> psn;
  std::string agent;
  friend bool operator==(const RdmaHandshake&, const RdmaHandshake&) = default;
};

// Checks what decode_rdma_handshake() checks on the fields (sizes, ranges), for locally built
// records. Errors: kInvalidValue "qpn and psn have 3 and 4 items", "port_num must be at least 1",
// "agent must not be empty"; kTooLarge "65 QPs, limit 64", "agent is 300 bytes, limit 256";
// kOutOfRange "path_mtu 9 is out of range 1..5", "qpn[2] 16777216 exceeds 24 bits".
Status validate_rdma_handshake(const RdmaHandshake& record);

// Encodes a record; does not validate (run validate_rdma_handshake() first).
std::string encode_rdma_handshake(const RdmaHandshake& record);

// Decodes and validates. Besides validate's errors: kMalformed "handshake is 10 bytes, needs at
// least 30", "bad handshake magic 0x1234", "handshake is 90 bytes, its header implies 94";
// kInvalidValue "unsupported handshake version 2, supported 1". On failure *out is unspecified.
Status decode_rdma_handshake(std::span<const std::byte> bytes, RdmaHandshake* out);

struct RdmaRegionKey {
  uint32_t rkey = 0;
  uint64_t addr = 0;
  friend bool operator==(const RdmaRegionKey&, const RdmaRegionKey&) = default;
};

std::string encode_rdma_region_key(const RdmaRegionKey& key);
// kMalformed "region key is 5 bytes, expected 13"; kInvalidValue "unsupported region key version 2".
Status decode_rdma_region_key(std::span<const std::byte> bytes, RdmaRegionKey* out);

}  // namespace pdr::proto
