#include "proto/transfer_frame.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "tests/support/hex.h"
#include "tests/support/status_matchers.h"

namespace pdr::proto {
namespace {

using pdr::test::from_hex;
using pdr::test::to_hex;

constexpr uint64_t kMax64 = std::numeric_limits<uint64_t>::max();

using HeaderBytes = std::array<std::byte, kTransferFrameHeaderBytes>;

using pdr::test::Fails;

HeaderBytes encode(const TransferFrameHeader& header) {
  HeaderBytes bytes;
  encode_frame_header(header, bytes);
  return bytes;
}

TransferFrameHeader sample() {
  TransferFrameHeader header;
  header.opcode = FrameOpcode::kReadData;
  header.flags = 0x0A0B0C0D;
  header.xfer_id = 0x1122334455667788;
  header.region_id = 0x01020304;
  header.offset = 0x0102030405060708;
  header.length = 0x1000;
  return header;
}

// ---- encode: the exact wire bytes ----

TEST(TransferFrame, EncodesLittleEndianAtDocumentedOffsets) {
  EXPECT_EQ(to_hex(encode(sample())),
            "5058"              // magic 0x5850, 'P' 'X'
            "01"                // version
            "03"                // READ_DATA
            "0d0c0b0a"          // flags
            "8877665544332211"  // xfer_id
            "04030201"          // region_id
            "00000000"          // reserved
            "0807060504030201"  // offset
            "0010000000000000"  // length
  );
}

TEST(TransferFrame, RoundTripsEveryOpcodeAndExtremeValues) {
  for (uint8_t op = 1; op <= 8; ++op) {
    TransferFrameHeader header;
    header.opcode = static_cast<FrameOpcode>(op);
    header.flags = std::numeric_limits<uint32_t>::max();
    header.xfer_id = kMax64;
    header.region_id = std::numeric_limits<uint32_t>::max();
    header.offset = 0;
    header.length = kMax64;
    const HeaderBytes bytes = encode(header);
    TransferFrameHeader decoded;
    ASSERT_TRUE(decode_frame_header(bytes, kMax64, &decoded).is_ok()) << int{op};
    EXPECT_EQ(decoded, header);
  }
  const TransferFrameHeader header = sample();
  TransferFrameHeader decoded;
  ASSERT_TRUE(decode_frame_header(encode(header), kMax64, &decoded).is_ok());
  EXPECT_EQ(decoded, header);
}

TEST(TransferFrame, OpcodeNames) {
  EXPECT_EQ(to_string(FrameOpcode::kWrite), "WRITE");
  EXPECT_EQ(to_string(FrameOpcode::kReadReq), "READ_REQ");
  EXPECT_EQ(to_string(FrameOpcode::kReadData), "READ_DATA");
  EXPECT_EQ(to_string(FrameOpcode::kAck), "ACK");
  EXPECT_EQ(to_string(FrameOpcode::kNotify), "NOTIFY");
  EXPECT_EQ(to_string(FrameOpcode::kHello), "HELLO");
  EXPECT_EQ(to_string(FrameOpcode::kError), "ERROR");
  EXPECT_EQ(to_string(FrameOpcode::kChallenge), "CHALLENGE");
  EXPECT_EQ(to_string(static_cast<FrameOpcode>(0)), "UNKNOWN");
}

// ---- decode errors, one per check ----

TEST(TransferFrame, RejectsWrongSize) {
  const HeaderBytes bytes = encode(sample());
  TransferFrameHeader out;
  EXPECT_TRUE(Fails(decode_frame_header(std::span(bytes).first(39), kMax64, &out),
                    StatusCode::kMalformed, "frame header is 39 bytes, expected 40"));
  EXPECT_TRUE(Fails(decode_frame_header({}, kMax64, &out), StatusCode::kMalformed,
                    "frame header is 0 bytes, expected 40"));
  std::array<std::byte, 41> longer{};
  EXPECT_TRUE(Fails(decode_frame_header(longer, kMax64, &out), StatusCode::kMalformed,
                    "frame header is 41 bytes, expected 40"));
}

TEST(TransferFrame, RejectsBadMagic) {
  HeaderBytes bytes = encode(sample());
  bytes[0] = std::byte{0x58};
  bytes[1] = std::byte{0x50};
  TransferFrameHeader out;
  EXPECT_TRUE(Fails(decode_frame_header(bytes, kMax64, &out), StatusCode::kMalformed,
                    "bad frame magic 0x5058, expected 0x5850"));
}

TEST(TransferFrame, RejectsUnsupportedVersion) {
  TransferFrameHeader out;
  TransferFrameHeader header = sample();
  header.version = 0;
  EXPECT_TRUE(Fails(decode_frame_header(encode(header), kMax64, &out), StatusCode::kInvalidValue,
                    "unsupported frame version 0, supported 1..1"));
  header.version = 2;
  EXPECT_TRUE(Fails(decode_frame_header(encode(header), kMax64, &out), StatusCode::kInvalidValue,
                    "unsupported frame version 2, supported 1..1"));
  header.version = 255;
  EXPECT_TRUE(Fails(decode_frame_header(encode(header), kMax64, &out), StatusCode::kInvalidValue,
                    "unsupported frame version 255, supported 1..1"));
}

TEST(TransferFrame, RejectsUnknownOpcode) {
  TransferFrameHeader out;
  for (uint8_t op : {0, 9, 255}) {
    HeaderBytes bytes = encode(sample());
    bytes[3] = std::byte{op};
    EXPECT_TRUE(Fails(decode_frame_header(bytes, kMax64, &out), StatusCode::kInvalidValue,
                      "unknown frame opcode " + std::to_string(op)));
  }
}

TEST(TransferFrame, RejectsNonZeroReserved) {
  TransferFrameHeader out;
  HeaderBytes bytes = encode(sample());
  bytes[23] = std::byte{0x80};
  EXPECT_TRUE(Fails(decode_frame_header(bytes, kMax64, &out), StatusCode::kMalformed,
                    "frame reserved word is 2147483648, must be 0"));
  bytes = encode(sample());
  bytes[20] = std::byte{1};
  EXPECT_TRUE(Fails(decode_frame_header(bytes, kMax64, &out), StatusCode::kMalformed,
                    "frame reserved word is 1, must be 0"));
}

TEST(TransferFrame, LengthLimitIsInclusive) {
  TransferFrameHeader header = sample();
  header.length = 1 << 20;
  TransferFrameHeader out;
  EXPECT_TRUE(decode_frame_header(encode(header), 1 << 20, &out).is_ok());
  EXPECT_TRUE(Fails(decode_frame_header(encode(header), (1 << 20) - 1, &out),
                    StatusCode::kTooLarge, "frame length 1048576 exceeds the limit 1048575"));
  header.length = 0;
  EXPECT_TRUE(decode_frame_header(encode(header), 0, &out).is_ok());
  header.length = kMax64;
  header.offset = 0;
  EXPECT_TRUE(Fails(decode_frame_header(encode(header), kMax64 - 1, &out), StatusCode::kTooLarge,
                    "frame length 18446744073709551615 exceeds the limit 18446744073709551614"));
}

TEST(TransferFrame, RejectsOffsetPlusLengthOverflow) {
  TransferFrameHeader header = sample();
  TransferFrameHeader out;
  header.offset = kMax64;
  header.length = 0;
  EXPECT_TRUE(decode_frame_header(encode(header), kMax64, &out).is_ok()) << "sum is exactly max";
  header.length = 1;
  EXPECT_TRUE(Fails(decode_frame_header(encode(header), kMax64, &out), StatusCode::kOutOfRange,
                    "frame offset 18446744073709551615 + length 1 overflows 64 bits"));
  header.offset = 1;
  header.length = kMax64;
  EXPECT_TRUE(Fails(decode_frame_header(encode(header), kMax64, &out), StatusCode::kOutOfRange,
                    "frame offset 1 + length 18446744073709551615 overflows 64 bits"));
  header.offset = kMax64 / 2 + 1;
  header.length = kMax64 / 2;
  EXPECT_TRUE(decode_frame_header(encode(header), kMax64, &out).is_ok());
  header.length = kMax64 / 2 + 1;
  EXPECT_FALSE(decode_frame_header(encode(header), kMax64, &out).is_ok());
}

TEST(TransferFrame, ChecksRunInDocumentedOrder) {
  // Bad magic and a bad opcode and a non-zero reserved word: magic is reported.
  HeaderBytes bytes = encode(sample());
  bytes[0] = std::byte{0};
  bytes[3] = std::byte{0};
  bytes[20] = std::byte{1};
  TransferFrameHeader out;
  EXPECT_EQ(decode_frame_header(bytes, kMax64, &out).message(),
            "bad frame magic 0x5800, expected 0x5850");
  bytes = encode(sample());
  bytes[3] = std::byte{9};
  bytes[20] = std::byte{1};
  EXPECT_EQ(decode_frame_header(bytes, kMax64, &out).message(), "unknown frame opcode 9");
}

// ---- HELLO payload and proof message ----

TEST(TransferHello, PayloadRoundTrips) {
  std::array<std::byte, kTransferProofBytes> proof;
  for (size_t i = 0; i < proof.size(); ++i) proof[i] = std::byte(i * 7);
  const std::vector<std::byte> bytes = encode_hello_payload(proof, "prefill-0");
  ASSERT_EQ(bytes.size(), kTransferProofBytes + 9);
  HelloPayload out;
  ASSERT_TRUE(decode_hello_payload(bytes, 256, &out).is_ok());
  EXPECT_EQ(out.proof, proof);
  EXPECT_EQ(out.agent, "prefill-0");
}

TEST(TransferHello, RefusesMissingProofOrName) {
  HelloPayload out;
  // An old-style HELLO (just a name) is too short to hold a proof.
  const std::string old = "attacker";
  EXPECT_TRUE(Fails(decode_hello_payload(std::as_bytes(std::span(old.data(), old.size())), 256, &out),
                    StatusCode::kMalformed,
                    "HELLO payload is 8 bytes, needs a 32-byte proof and a name"));
  std::array<std::byte, kTransferProofBytes> proof_only{};
  EXPECT_TRUE(Fails(decode_hello_payload(proof_only, 256, &out), StatusCode::kMalformed,
                    "HELLO payload is 32 bytes, needs a 32-byte proof and a name"));
  std::vector<std::byte> long_name(kTransferProofBytes + 257, std::byte{'x'});
  EXPECT_TRUE(Fails(decode_hello_payload(long_name, 256, &out), StatusCode::kTooLarge,
                    "HELLO agent name is 257 bytes, limit 256"));
  long_name.pop_back();
  EXPECT_TRUE(decode_hello_payload(long_name, 256, &out).is_ok());
}

TEST(TransferHello, ProofMessageBindsNonceAndName) {
  std::array<std::byte, kTransferNonceBytes> nonce;
  for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = std::byte(0xa0 + i);
  const std::vector<std::byte> message = hello_proof_message(nonce, "d-1");
  const std::string label = "pdr-transfer-hello-v1";
  ASSERT_EQ(message.size(), label.size() + 1 + kTransferNonceBytes + 3);
  EXPECT_EQ(std::memcmp(message.data(), label.data(), label.size()), 0);
  EXPECT_EQ(message[label.size()], std::byte{0});
  EXPECT_EQ(std::memcmp(message.data() + label.size() + 1, nonce.data(), nonce.size()), 0);
  EXPECT_EQ(std::memcmp(message.data() + label.size() + 1 + nonce.size(), "d-1", 3), 0);
  EXPECT_NE(hello_proof_message(nonce, "d-2"), message);
  nonce[0] = std::byte{0};
  EXPECT_NE(hello_proof_message(nonce, "d-1"), message);
}

// ---- RegionBounds / check_region_access ----

TEST(RegionBounds, LooksUpRegisteredRegions) {
  RegionBounds bounds;
  uint64_t length = 0;
  EXPECT_FALSE(bounds.find(0, &length));
  ASSERT_TRUE(bounds.set(3, 4096).is_ok());
  EXPECT_TRUE(bounds.find(3, &length));
  EXPECT_EQ(length, 4096u);
  EXPECT_FALSE(bounds.find(2, &length)) << "gap below a registered id";
  EXPECT_FALSE(bounds.find(4, &length));
  ASSERT_TRUE(bounds.set(3, 8192).is_ok());
  EXPECT_TRUE(bounds.find(3, &length));
  EXPECT_EQ(length, 8192u);
  bounds.erase(3);
  EXPECT_FALSE(bounds.find(3, &length));
  bounds.erase(1000);  // unknown: ignored
  ASSERT_TRUE(bounds.set(RegionBounds::kMaxRegionId, kMax64).is_ok());
  EXPECT_TRUE(bounds.find(RegionBounds::kMaxRegionId, &length));
  EXPECT_EQ(length, kMax64);
}

TEST(RegionBounds, RefusesHugeIds) {
  RegionBounds bounds;
  EXPECT_TRUE(Fails(bounds.set(65536, 1), StatusCode::kOutOfRange,
                    "region id 65536 is out of range 0..65535"));
  EXPECT_TRUE(Fails(bounds.set(std::numeric_limits<uint32_t>::max(), 1), StatusCode::kOutOfRange,
                    "region id 4294967295 is out of range 0..65535"));
}

TEST(CheckRegionAccess, UnknownRegion) {
  RegionBounds bounds;
  ASSERT_TRUE(bounds.set(1, 100).is_ok());
  EXPECT_TRUE(Fails(check_region_access(bounds, 7, 0, 0), StatusCode::kNotFound,
                    "region 7 is not registered"));
  EXPECT_TRUE(Fails(check_region_access(bounds, 0, 0, 0), StatusCode::kNotFound,
                    "region 0 is not registered"));
  EXPECT_TRUE(Fails(check_region_access(bounds, std::numeric_limits<uint32_t>::max(), 0, 0),
                    StatusCode::kNotFound, "region 4294967295 is not registered"));
}

TEST(CheckRegionAccess, BoundariesAreExact) {
  RegionBounds bounds;
  ASSERT_TRUE(bounds.set(7, 8192).is_ok());
  EXPECT_TRUE(check_region_access(bounds, 7, 0, 8192).is_ok());
  EXPECT_TRUE(check_region_access(bounds, 7, 4096, 4096).is_ok());
  EXPECT_TRUE(check_region_access(bounds, 7, 8192, 0).is_ok()) << "empty access at the end";
  EXPECT_TRUE(Fails(check_region_access(bounds, 7, 4096, 4097), StatusCode::kOutOfRange,
                    "offset 4096 + length 4097 is outside region 7 (8192 bytes)"));
  EXPECT_TRUE(Fails(check_region_access(bounds, 7, 8193, 0), StatusCode::kOutOfRange,
                    "offset 8193 + length 0 is outside region 7 (8192 bytes)"));
  EXPECT_TRUE(Fails(check_region_access(bounds, 7, 0, 8193), StatusCode::kOutOfRange,
                    "offset 0 + length 8193 is outside region 7 (8192 bytes)"));
}

TEST(CheckRegionAccess, NeverOverflows) {
  RegionBounds bounds;
  ASSERT_TRUE(bounds.set(0, 8192).is_ok());
  ASSERT_TRUE(bounds.set(1, kMax64).is_ok());
  // offset + length would wrap to a small number: still refused.
  EXPECT_FALSE(check_region_access(bounds, 0, kMax64, 2).is_ok());
  EXPECT_FALSE(check_region_access(bounds, 0, 2, kMax64).is_ok());
  EXPECT_FALSE(check_region_access(bounds, 0, kMax64, kMax64).is_ok());
  EXPECT_TRUE(check_region_access(bounds, 1, 0, kMax64).is_ok());
  EXPECT_TRUE(check_region_access(bounds, 1, kMax64, 0).is_ok());
  EXPECT_TRUE(check_region_access(bounds, 1, 1, kMax64 - 1).is_ok());
  EXPECT_TRUE(Fails(check_region_access(bounds, 1, 1, kMax64), StatusCode::kOutOfRange,
                    "offset 1 + length 18446744073709551615 is outside region 1 "
                    "(18446744073709551615 bytes)"));
}

TEST(CheckRegionAccess, ErasedRegionIsNotFound) {
  RegionBounds bounds;
  ASSERT_TRUE(bounds.set(2, 64).is_ok());
  bounds.erase(2);
  EXPECT_EQ(check_region_access(bounds, 2, 0, 1).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdr::proto
