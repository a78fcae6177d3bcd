// libFuzzer target for the transfer frame header codec (proto/transfer_frame.h).
//
// Besides "no crash, no sanitizer report", it checks: every header that decodes re-encodes to the
// exact input bytes (the format has no redundancy, so decode/encode is a bijection on valid
// headers) and decodes again to the same fields; a header accepted under some length cap is
// refused under a smaller one; and check_region_access() agrees with plain 128-bit arithmetic.
// Every input is also tried as a HELLO payload (proof + agent name): one that decodes re-encodes to
// the same bytes, is refused under a smaller name limit, and its proof message has the documented
// size.
// Seed corpus: tests/fuzz/corpus/transfer_frame/ (one header per opcode, one HELLO payload).
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "proto/transfer_frame.h"

namespace {

using pdr::proto::kTransferFrameHeaderBytes;
using pdr::proto::TransferFrameHeader;

void check_region_access_agrees(const TransferFrameHeader& header) {
  pdr::proto::RegionBounds bounds;
  const uint32_t id = header.region_id % 8;
  const uint64_t region_length = header.xfer_id;  // any 64-bit value
  if (!bounds.set(id, region_length)) __builtin_trap();
  const auto end = static_cast<unsigned __int128>(header.offset) + header.length;
  const bool inside = end <= region_length;
  if (pdr::proto::check_region_access(bounds, id, header.offset, header.length).is_ok() != inside) {
    __builtin_trap();
  }
  if (pdr::proto::check_region_access(bounds, id + 8, header.offset, header.length).is_ok()) {
    __builtin_trap();  // never registered
  }
}

void check_hello_payload(std::span<const std::byte> bytes) {
  constexpr size_t kMaxAgent = 256;
  pdr::proto::HelloPayload hello;
  if (!pdr::proto::decode_hello_payload(bytes, kMaxAgent, &hello)) return;
  if (hello.agent.empty() || hello.agent.size() > kMaxAgent) __builtin_trap();
  const std::vector<std::byte> encoded = pdr::proto::encode_hello_payload(hello.proof, hello.agent);
  if (encoded.size() != bytes.size() ||
      std::memcmp(encoded.data(), bytes.data(), bytes.size()) != 0) {
    __builtin_trap();
  }
  if (pdr::proto::decode_hello_payload(bytes, hello.agent.size() - 1, &hello)) __builtin_trap();
  std::array<std::byte, pdr::proto::kTransferNonceBytes> nonce{};
  const std::vector<std::byte> message = pdr::proto::hello_proof_message(nonce, hello.agent);
  if (message.size() != 22 + nonce.size() + hello.agent.size()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  check_hello_payload(bytes);
  TransferFrameHeader header;
  if (!pdr::proto::decode_frame_header(bytes, std::numeric_limits<uint64_t>::max(), &header)) {
    return 0;
  }
  std::array<std::byte, kTransferFrameHeaderBytes> encoded;
  pdr::proto::encode_frame_header(header, encoded);
  if (std::memcmp(encoded.data(), data, kTransferFrameHeaderBytes) != 0) __builtin_trap();
  TransferFrameHeader again;
  if (!pdr::proto::decode_frame_header(encoded, std::numeric_limits<uint64_t>::max(), &again)) {
    __builtin_trap();
  }
  if (!(again == header)) __builtin_trap();
  if (header.length > 0 && pdr::proto::decode_frame_header(bytes, header.length - 1, &again)) {
    __builtin_trap();
  }
  if (!pdr::proto::decode_frame_header(bytes, header.length, &again)) __builtin_trap();
  check_region_access_agrees(header);
  return 0;
}
