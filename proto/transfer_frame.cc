// Transfer frame header codec (contract: transfer_frame.h). Integers are assembled byte by byte, so
// the wire format does not depend on host endianness or struct padding.
#include "proto/transfer_frame.h"

#include "proto/little_endian.h"

#include <cstring>
#include <limits>
#include <string>

namespace pdr::proto {

namespace {

constexpr size_t kMagicAt = 0;
constexpr size_t kVersionAt = 2;
constexpr size_t kOpcodeAt = 3;
constexpr size_t kFlagsAt = 4;
constexpr size_t kXferIdAt = 8;
constexpr size_t kRegionIdAt = 16;
constexpr size_t kReservedAt = 20;
constexpr size_t kOffsetAt = 24;
constexpr size_t kLengthAt = 32;
static_assert(kLengthAt + sizeof(uint64_t) == kTransferFrameHeaderBytes);

bool is_known_opcode(uint8_t opcode) {
  return opcode >= static_cast<uint8_t>(FrameOpcode::kWrite) &&
         opcode <= static_cast<uint8_t>(FrameOpcode::kChallenge);
}

constexpr std::string_view kHelloProofLabel = "pdr-transfer-hello-v1";

}  // namespace

std::string_view to_string(FrameOpcode opcode) {
  switch (opcode) {
    case FrameOpcode::kWrite: return "WRITE";
    case FrameOpcode::kReadReq: return "READ_REQ";
    case FrameOpcode::kReadData: return "READ_DATA";
    case FrameOpcode::kAck: return "ACK";
    case FrameOpcode::kNotify: return "NOTIFY";
    case FrameOpcode::kHello: return "HELLO";
    case FrameOpcode::kError: return "ERROR";
    case FrameOpcode::kChallenge: return "CHALLENGE";
  }
  return "UNKNOWN";
}

void encode_frame_header(const TransferFrameHeader& header,
                         std::span<std::byte, kTransferFrameHeaderBytes> out) {
  std::byte* p = out.data();
  put_le<uint16_t>(p + kMagicAt, kTransferFrameMagic);
  put_le<uint8_t>(p + kVersionAt, header.version);
  put_le<uint8_t>(p + kOpcodeAt, static_cast<uint8_t>(header.opcode));
  put_le<uint32_t>(p + kFlagsAt, header.flags);
  put_le<uint64_t>(p + kXferIdAt, header.xfer_id);
  put_le<uint32_t>(p + kRegionIdAt, header.region_id);
  put_le<uint32_t>(p + kReservedAt, 0);
  put_le<uint64_t>(p + kOffsetAt, header.offset);
  put_le<uint64_t>(p + kLengthAt, header.length);
}

Status decode_frame_header(std::span<const std::byte> bytes, uint64_t max_length,
                           TransferFrameHeader* out) {
  if (bytes.size() != kTransferFrameHeaderBytes) {
    return Status(StatusCode::kMalformed, "frame header is " + std::to_string(bytes.size()) +
                                              " bytes, expected " +
                                              std::to_string(kTransferFrameHeaderBytes));
  }
  const std::byte* p = bytes.data();
  const auto magic = get_le<uint16_t>(p + kMagicAt);
  if (magic != kTransferFrameMagic) {
    return Status(StatusCode::kMalformed, "bad frame magic " + hex16(magic) + ", expected " +
                                              hex16(kTransferFrameMagic));
  }
  const auto version = get_le<uint8_t>(p + kVersionAt);
  if (version < 1 || version > kTransferFrameVersion) {
    return Status(StatusCode::kInvalidValue,
                  "unsupported frame version " + std::to_string(version) + ", supported 1.." +
                      std::to_string(kTransferFrameVersion));
  }
  const auto opcode = get_le<uint8_t>(p + kOpcodeAt);
  if (!is_known_opcode(opcode)) {
    return Status(StatusCode::kInvalidValue, "unknown frame opcode " + std::to_string(opcode));
  }
  const auto reserved = get_le<uint32_t>(p + kReservedAt);
  if (reserved != 0) {
    return Status(StatusCode::kMalformed,
                  "frame reserved word is " + std::to_string(reserved) + ", must be 0");
  }
  const auto offset = get_le<uint64_t>(p + kOffsetAt);
  const auto length = get_le<uint64_t>(p + kLengthAt);
  if (length > max_length) {
    return Status(StatusCode::kTooLarge, "frame length " + std::to_string(length) +
                                             " exceeds the limit " + std::to_string(max_length));
  }
  if (length > std::numeric_limits<uint64_t>::max() - offset) {
    return Status(StatusCode::kOutOfRange, "frame offset " + std::to_string(offset) +
                                               " + length " + std::to_string(length) +
                                               " overflows 64 bits");
  }
  out->version = version;
  out->opcode = static_cast<FrameOpcode>(opcode);
  out->flags = get_le<uint32_t>(p + kFlagsAt);
  out->xfer_id = get_le<uint64_t>(p + kXferIdAt);
  out->region_id = get_le<uint32_t>(p + kRegionIdAt);
  out->offset = offset;
  out->length = length;
  return Status::ok();
}

std::vector<std::byte> encode_hello_payload(std::span<const std::byte, kTransferProofBytes> proof,
                                            std::string_view agent) {
  std::vector<std::byte> out(kTransferProofBytes + agent.size());
  std::memcpy(out.data(), proof.data(), kTransferProofBytes);
  if (!agent.empty()) std::memcpy(out.data() + kTransferProofBytes, agent.data(), agent.size());
  return out;
}

Status decode_hello_payload(std::span<const std::byte> bytes, size_t max_agent_bytes,
                            HelloPayload* out) {
  if (bytes.size() <= kTransferProofBytes) {
    return Status(StatusCode::kMalformed, "HELLO payload is " + std::to_string(bytes.size()) +
                                              " bytes, needs a " +
                                              std::to_string(kTransferProofBytes) +
                                              "-byte proof and a name");
  }
  const size_t agent_bytes = bytes.size() - kTransferProofBytes;
  if (agent_bytes > max_agent_bytes) {
    return Status(StatusCode::kTooLarge, "HELLO agent name is " + std::to_string(agent_bytes) +
                                             " bytes, limit " + std::to_string(max_agent_bytes));
  }
  std::memcpy(out->proof.data(), bytes.data(), kTransferProofBytes);
  out->agent = std::string_view(reinterpret_cast<const char*>(bytes.data()) + kTransferProofBytes,
                                agent_bytes);
  return Status::ok();
}

std::vector<std::byte> hello_proof_message(std::span<const std::byte, kTransferNonceBytes> nonce,
                                           std::string_view agent) {
  std::vector<std::byte> out(kHelloProofLabel.size() + 1 + kTransferNonceBytes + agent.size());
  std::byte* p = out.data();
  std::memcpy(p, kHelloProofLabel.data(), kHelloProofLabel.size());
  p += kHelloProofLabel.size();
  *p++ = std::byte{0};
  std::memcpy(p, nonce.data(), kTransferNonceBytes);
  p += kTransferNonceBytes;
  if (!agent.empty()) std::memcpy(p, agent.data(), agent.size());
  return out;
}

Status RegionBounds::set(uint32_t id, uint64_t length) {
  if (id > kMaxRegionId) {
    return Status(StatusCode::kOutOfRange, "region id " + std::to_string(id) +
                                               " is out of range 0.." +
                                               std::to_string(kMaxRegionId));
  }
  if (id >= entries_.size()) entries_.resize(size_t{id} + 1);
  entries_[id] = Entry{true, length};
  return Status::ok();
}

void RegionBounds::erase(uint32_t id) {
  if (id < entries_.size()) entries_[id] = Entry{};
}

bool RegionBounds::find(uint32_t id, uint64_t* length) const {
  if (id >= entries_.size() || !entries_[id].registered) return false;
  *length = entries_[id].length;
  return true;
}

Status check_region_access(const RegionBounds& bounds, uint32_t region_id, uint64_t offset,
                           uint64_t length) {
  uint64_t region_length = 0;
  if (!bounds.find(region_id, &region_length)) {
    return Status(StatusCode::kNotFound,
                  "region " + std::to_string(region_id) + " is not registered");
  }
  if (offset > region_length || length > region_length - offset) {
    return Status(StatusCode::kOutOfRange,
                  "offset " + std::to_string(offset) + " + length " + std::to_string(length) +
                      " is outside region " + std::to_string(region_id) + " (" +
                      std::to_string(region_length) + " bytes)");
  }
  return Status::ok();
}

}  // namespace pdr::proto
