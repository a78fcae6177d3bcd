// Frame header of the transfer engine's TCP backend (docs/design/kv-transfer.md, T-1), plus the
// (region_id, offset, length) bounds check the receiver runs before touching memory (T-3). Pure
// functions over byte spans: no I/O, no allocation on encode/decode.
//
// Wire layout, all integers little-endian, no padding (offsets in bytes):
//
//    0  u16 magic      0x5850 (the bytes 'P' 'X')
//    2  u8  version    1
//    3  u8  opcode     FrameOpcode: 1 WRITE, 2 READ_REQ, 3 READ_DATA, 4 ACK, 5 NOTIFY, 6 HELLO,
//                      7 ERROR, 8 CHALLENGE
//    4  u32 flags      opcode-specific bits; carried verbatim, not interpreted here
//    8  u64 xfer_id    initiator-chosen transfer id
//   16  u32 region_id  target region (RegionId on the receiving side), not a virtual address
//   20  u32 reserved   must be 0 (a receiver refuses anything else, so the field can gain a meaning
//                      under a new version)
//   24  u64 offset     byte offset inside the region
//   32  u64 length     payload bytes that follow (WRITE, READ_DATA) or bytes requested (READ_REQ)
//   40  end            -> kTransferFrameHeaderBytes
//
// Note: an early sketch of T-1 called this header "32 bytes", but its field list adds up to 40; the field
// list wins here.
//
// A header is followed by `length` payload bytes for WRITE and READ_DATA; for other opcodes the
// meaning of offset/length is the transport's business (they are still range-checked the same way).
//
// Lane authentication (the TCP backend's handshake): on accept the server sends CHALLENGE, whose
// payload is a fresh random nonce of kTransferNonceBytes. The client answers with HELLO, whose
// payload is
//
//    0  32 bytes  proof = HMAC-SHA256(key = the server's descriptor secret,
//                                     message = hello_proof_message(nonce, client agent))
//   32  1..N      the client's agent name
//
// hello_proof_message() is "pdr-transfer-hello-v1", one zero byte, the nonce, then the agent name,
// so a proof is bound to one connection (nonce) and one claimed name. The MAC itself is computed
// and verified by the transport (libsodium); this file only frames the bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "proto/base/status.h"

namespace pdr::proto {

inline constexpr size_t kTransferFrameHeaderBytes = 40;
inline constexpr uint16_t kTransferFrameMagic = 0x5850;
inline constexpr uint8_t kTransferFrameVersion = 1;
inline constexpr size_t kTransferNonceBytes = 32;  // CHALLENGE payload
inline constexpr size_t kTransferProofBytes = 32;  // HMAC-SHA256 at the start of a HELLO payload

enum class FrameOpcode : uint8_t {
  kWrite = 1,     // payload to store at (region_id, offset)
  kReadReq = 2,   // ask the peer for `length` bytes at (region_id, offset)
  kReadData = 3,  // answer to a READ_REQ; payload follows
  kAck = 4,       // the peer applied a WRITE (possibly cumulative, T-2)
  kNotify = 5,    // transfer-level notification, ordered after its data (T-10)
  kHello = 6,     // lane handshake
  kError = 7,     // the peer refused or failed a request
  kChallenge = 8, // the server's first frame on a connection: a nonce the HELLO proof covers
};

// "WRITE", "READ_REQ", "READ_DATA", "ACK", "NOTIFY", "HELLO", "ERROR", "CHALLENGE"; "UNKNOWN"
// otherwise.
std::string_view to_string(FrameOpcode opcode);

// A decoded header. Magic and the reserved word are not fields: encode writes the constants, and
// decode refuses anything else.
struct TransferFrameHeader {
  uint8_t version = kTransferFrameVersion;
  FrameOpcode opcode = FrameOpcode::kWrite;
  uint32_t flags = 0;
  uint64_t xfer_id = 0;
  uint32_t region_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  friend bool operator==(const TransferFrameHeader&, const TransferFrameHeader&) = default;
};

// Writes exactly kTransferFrameHeaderBytes into `out`. Does not validate `header`: the sender owns
// its values (a header that decode_frame_header() would refuse is still written as given).
void encode_frame_header(const TransferFrameHeader& header,
                         std::span<std::byte, kTransferFrameHeaderBytes> out);

// Decodes one header from untrusted bytes. Checks, in this order, each with its own Status:
//   kMalformed     bytes.size() != kTransferFrameHeaderBytes; bad magic; reserved word non-zero
//   kInvalidValue  version other than 1..kTransferFrameVersion; opcode not a FrameOpcode
//   kTooLarge      length > max_length (the caller's cap, e.g. its largest frame payload)
//   kOutOfRange    offset + length overflows 64 bits
// On failure *out is left unspecified.
Status decode_frame_header(std::span<const std::byte> bytes, uint64_t max_length,
                           TransferFrameHeader* out);

// A HELLO payload split into its parts. `agent` points into the decoded bytes.
struct HelloPayload {
  std::array<std::byte, kTransferProofBytes> proof{};
  std::string_view agent;
};

// proof followed by agent: exactly the HELLO payload bytes (the caller sends them after a header of
// length kTransferProofBytes + agent.size()).
std::vector<std::byte> encode_hello_payload(std::span<const std::byte, kTransferProofBytes> proof,
                                            std::string_view agent);

// Splits an untrusted HELLO payload. Errors:
//   kMalformed  shorter than kTransferProofBytes + 1 ("HELLO payload is 5 bytes, needs a 32-byte
//               proof and a name")
//   kTooLarge   the agent name is longer than max_agent_bytes
Status decode_hello_payload(std::span<const std::byte> bytes, size_t max_agent_bytes,
                            HelloPayload* out);

// The bytes the HELLO proof is a MAC of (see the layout above).
std::vector<std::byte> hello_proof_message(std::span<const std::byte, kTransferNonceBytes> nonce,
                                           std::string_view agent);

// The receiver's table of registered regions: region id -> length in bytes. Region ids are small
// dense integers handed out by the engine, so lookup is a vector index. A plain value type: any
// number of threads may call check_region_access() on one table concurrently; changes need the
// owner's synchronisation (or a copy published atomically).
class RegionBounds {
 public:
  // Ids above this are refused by set(), so a bad id cannot make the table huge.
  static constexpr uint32_t kMaxRegionId = 65535;

  // Registers (or re-sizes) region `id`. kOutOfRange when id > kMaxRegionId.
  Status set(uint32_t id, uint64_t length);
  // Forgets region `id`; unknown ids are ignored.
  void erase(uint32_t id);
  // The length of region `id`, or false when it is not registered.
  bool find(uint32_t id, uint64_t* length) const;

 private:
  struct Entry {
    bool registered = false;
    uint64_t length = 0;
  };
  std::vector<Entry> entries_;
};

// ok when [offset, offset + length) lies inside registered region `region_id` (a zero-length access
// at offset == region length is inside). Never overflows. Errors:
//   kNotFound    "region 7 is not registered"
//   kOutOfRange  "offset 4096 + length 8192 is outside region 7 (8192 bytes)"
Status check_region_access(const RegionBounds& bounds, uint32_t region_id, uint64_t offset,
                           uint64_t length);

}  // namespace pdr::proto
