// RDMA handshake record and region key codecs (contract: rdma_handshake.h). Integers are assembled
// byte by byte, as in transfer_frame.cc, so the format depends on neither endianness nor padding.
#include "proto/rdma_handshake.h"

#include "proto/little_endian.h"

#include <string>

namespace pdr::proto {

namespace {

constexpr uint8_t kMinMtu = 1;  // IBV_MTU_256
constexpr uint8_t kMaxMtu = 5;  // IBV_MTU_4096
constexpr uint8_t kMaxGidType = 2;
constexpr uint8_t kRegionKeyVersion = 1;

}  // namespace

Status validate_rdma_handshake(const RdmaHandshake& record) {
  if (record.qpn.size() != record.psn.size()) {
    return Status(StatusCode::kInvalidValue, "qpn and psn have " +
                                                 std::to_string(record.qpn.size()) + " and " +
                                                 std::to_string(record.psn.size()) + " items");
  }
  if (record.qpn.empty()) return Status(StatusCode::kInvalidValue, "qp_count must be at least 1");
  if (record.qpn.size() > kRdmaMaxQps) {
    return Status(StatusCode::kTooLarge, std::to_string(record.qpn.size()) + " QPs, limit " +
                                             std::to_string(kRdmaMaxQps));
  }
  if (record.port_num == 0) return Status(StatusCode::kInvalidValue, "port_num must be at least 1");
  if (record.path_mtu < kMinMtu || record.path_mtu > kMaxMtu) {
    return Status(StatusCode::kOutOfRange, "path_mtu " + std::to_string(record.path_mtu) +
                                               " is out of range 1..5");
  }
  if (record.gid_type > kMaxGidType) {
    return Status(StatusCode::kOutOfRange, "gid_type " + std::to_string(record.gid_type) +
                                               " is out of range 0..2");
  }
  if (record.max_rd_atomic == 0) {
    return Status(StatusCode::kInvalidValue, "max_rd_atomic must be at least 1");
  }
  for (size_t i = 0; i < record.qpn.size(); ++i) {
    if (record.qpn[i] > kRdmaMax24Bit) {
      return Status(StatusCode::kOutOfRange, "qpn[" + std::to_string(i) + "] " +
                                                 std::to_string(record.qpn[i]) + " exceeds 24 bits");
    }
    if (record.psn[i] > kRdmaMax24Bit) {
      return Status(StatusCode::kOutOfRange, "psn[" + std::to_string(i) + "] " +
                                                 std::to_string(record.psn[i]) + " exceeds 24 bits");
    }
  }
  if (record.agent.empty()) return Status(StatusCode::kInvalidValue, "agent must not be empty");
  if (record.agent.size() > kRdmaMaxAgentBytes) {
    return Status(StatusCode::kTooLarge, "agent is " + std::to_string(record.agent.size()) +
                                             " bytes, limit " + std::to_string(kRdmaMaxAgentBytes));
  }
  return Status::ok();
}

std::string encode_rdma_handshake(const RdmaHandshake& record) {
  std::string out;
  out.reserve(kRdmaHandshakeHeaderBytes + 8 * record.qpn.size() + record.agent.size());
  append_le<uint16_t>(&out, kRdmaHandshakeMagic);
  append_le<uint8_t>(&out, kRdmaHandshakeVersion);
  for (uint8_t byte : record.gid) append_le<uint8_t>(&out, byte);
  append_le<uint16_t>(&out, record.lid);
  append_le<uint8_t>(&out, record.port_num);
  append_le<uint8_t>(&out, record.path_mtu);
  append_le<uint8_t>(&out, record.gid_type);
  append_le<uint8_t>(&out, record.max_rd_atomic);
  append_le<uint8_t>(&out, static_cast<uint8_t>(record.qpn.size()));
  append_le<uint16_t>(&out, static_cast<uint16_t>(record.agent.size()));
  for (uint32_t qpn : record.qpn) append_le<uint32_t>(&out, qpn);
  for (uint32_t psn : record.psn) append_le<uint32_t>(&out, psn);
  out += record.agent;
  return out;
}

Status decode_rdma_handshake(std::span<const std::byte> bytes, RdmaHandshake* out) {
  if (bytes.size() < kRdmaHandshakeHeaderBytes) {
    return Status(StatusCode::kMalformed, "handshake is " + std::to_string(bytes.size()) +
                                              " bytes, needs at least " +
                                              std::to_string(kRdmaHandshakeHeaderBytes));
  }
  const std::byte* p = bytes.data();
  const auto magic = get_le<uint16_t>(p);
  if (magic != kRdmaHandshakeMagic) {
    return Status(StatusCode::kMalformed, "bad handshake magic " + hex16(magic));
  }
  const auto version = get_le<uint8_t>(p + 2);
  if (version != kRdmaHandshakeVersion) {
    return Status(StatusCode::kInvalidValue, "unsupported handshake version " +
                                                 std::to_string(version) + ", supported 1");
  }
  size_t at = 3;
  for (auto& byte : out->gid) byte = get_le<uint8_t>(p + at++);
  out->lid = get_le<uint16_t>(p + at);
  at += 2;
  out->port_num = get_le<uint8_t>(p + at++);
  out->path_mtu = get_le<uint8_t>(p + at++);
  out->gid_type = get_le<uint8_t>(p + at++);
  out->max_rd_atomic = get_le<uint8_t>(p + at++);
  const size_t qp_count = get_le<uint8_t>(p + at++);
  const size_t agent_len = get_le<uint16_t>(p + at);
  at += 2;
  // Both counts are bounded by their field widths (255, 65535), so this cannot overflow.
  const size_t expected = kRdmaHandshakeHeaderBytes + 8 * qp_count + agent_len;
  if (bytes.size() != expected) {
    return Status(StatusCode::kMalformed, "handshake is " + std::to_string(bytes.size()) +
                                              " bytes, its header implies " +
                                              std::to_string(expected));
  }
  out->qpn.resize(qp_count);
  out->psn.resize(qp_count);
  for (size_t i = 0; i < qp_count; ++i) out->qpn[i] = get_le<uint32_t>(p + at + 4 * i);
  at += 4 * qp_count;
  for (size_t i = 0; i < qp_count; ++i) out->psn[i] = get_le<uint32_t>(p + at + 4 * i);
  at += 4 * qp_count;
  out->agent.assign(reinterpret_cast<const char*>(p + at), agent_len);
  return validate_rdma_handshake(*out);
}

std::string encode_rdma_region_key(const RdmaRegionKey& key) {
  std::string out;
  out.reserve(kRdmaRegionKeyBytes);
  append_le<uint8_t>(&out, kRegionKeyVersion);
  append_le<uint32_t>(&out, key.rkey);
  append_le<uint64_t>(&out, key.addr);
  return out;
}

Status decode_rdma_region_key(std::span<const std::byte> bytes, RdmaRegionKey* out) {
  if (bytes.size() != kRdmaRegionKeyBytes) {
    return Status(StatusCode::kMalformed, "region key is " + std::to_string(bytes.size()) +
                                              " bytes, expected " +
                                              std::to_string(kRdmaRegionKeyBytes));
  }
  const auto version = get_le<uint8_t>(bytes.data());
  if (version != kRegionKeyVersion) {
    return Status(StatusCode::kInvalidValue,
                  "unsupported region key version " + std::to_string(version));
  }
  out->rkey = get_le<uint32_t>(bytes.data() + 1);
  out->addr = get_le<uint64_t>(bytes.data() + 5);
  return Status::ok();
}

}  // namespace pdr::proto
