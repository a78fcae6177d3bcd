// RDMA handshake record and region key codecs (proto/rdma_handshake.h): round trips, the exact
// little-endian layout, and every error path.
#include "proto/rdma_handshake.h"

#include <gtest/gtest.h>

#include <array>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>

#include "tests/support/status_matchers.h"
#include "tests/support/source_path.h"

namespace pdr::proto {
namespace {

using test::Fails;

RdmaHandshake sample() {
  RdmaHandshake r;
  for (size_t i = 0; i < 16; ++i) r.gid[i] = static_cast<uint8_t>(i + 1);
  r.lid = 0x1234;
  r.port_num = 1;
  r.path_mtu = 5;
  r.gid_type = 2;
  r.max_rd_atomic = 16;
  r.qpn = {0x000011, 0xabcdef};
  r.psn = {0x123456, 0xffffff};
  r.agent = "prefill-0";
  return r;
}

Status decode(const std::string& bytes, RdmaHandshake* out) {
  return decode_rdma_handshake(std::as_bytes(std::span(bytes)), out);
}

TEST(RdmaHandshake, RoundTrips) {
  const RdmaHandshake r = sample();
  ASSERT_TRUE(validate_rdma_handshake(r));
  const std::string bytes = encode_rdma_handshake(r);
  EXPECT_EQ(bytes.size(), kRdmaHandshakeHeaderBytes + 16 + 9);
  RdmaHandshake back;
  ASSERT_TRUE(decode(bytes, &back));
  EXPECT_EQ(back, r);
}

TEST(RdmaHandshake, LayoutIsLittleEndian) {
  const std::string b = encode_rdma_handshake(sample());
  EXPECT_EQ(static_cast<uint8_t>(b[0]), 0x52);  // magic 0x4852
  EXPECT_EQ(static_cast<uint8_t>(b[1]), 0x48);
  EXPECT_EQ(static_cast<uint8_t>(b[2]), 1);     // version
  EXPECT_EQ(static_cast<uint8_t>(b[3]), 1);     // gid[0]
  EXPECT_EQ(static_cast<uint8_t>(b[19]), 0x34);  // lid low byte
  EXPECT_EQ(static_cast<uint8_t>(b[20]), 0x12);
  EXPECT_EQ(static_cast<uint8_t>(b[21]), 1);    // port
  EXPECT_EQ(static_cast<uint8_t>(b[22]), 5);    // mtu
  EXPECT_EQ(static_cast<uint8_t>(b[23]), 2);    // gid type
  EXPECT_EQ(static_cast<uint8_t>(b[24]), 16);   // rd atomic
  EXPECT_EQ(static_cast<uint8_t>(b[25]), 2);    // qp count
  EXPECT_EQ(static_cast<uint8_t>(b[26]), 9);    // agent length
  EXPECT_EQ(static_cast<uint8_t>(b[27]), 0);
  EXPECT_EQ(static_cast<uint8_t>(b[32]), 0xef);  // qpn[1] = 0xabcdef
  EXPECT_EQ(static_cast<uint8_t>(b[33]), 0xcd);
  EXPECT_EQ(static_cast<uint8_t>(b[34]), 0xab);
  EXPECT_EQ(b.substr(b.size() - 9), "prefill-0");
}

TEST(RdmaHandshake, DecodeRejectsShortInput) {
  RdmaHandshake out;
  EXPECT_TRUE(Fails(decode(std::string(10, '\0'), &out), StatusCode::kMalformed,
                    "handshake is 10 bytes, needs at least 28"));
  EXPECT_TRUE(Fails(decode("", &out), StatusCode::kMalformed,
                    "handshake is 0 bytes, needs at least 28"));
}

TEST(RdmaHandshake, DecodeRejectsBadMagicAndVersion) {
  RdmaHandshake out;
  std::string b = encode_rdma_handshake(sample());
  b[0] = 0x34;
  b[1] = 0x12;
  EXPECT_TRUE(Fails(decode(b, &out), StatusCode::kMalformed, "bad handshake magic 0x1234"));
  b = encode_rdma_handshake(sample());
  b[2] = 2;
  EXPECT_TRUE(Fails(decode(b, &out), StatusCode::kInvalidValue,
                    "unsupported handshake version 2, supported 1"));
}

TEST(RdmaHandshake, DecodeRejectsSizeMismatch) {
  RdmaHandshake out;
  const std::string b = encode_rdma_handshake(sample());
  EXPECT_TRUE(Fails(decode(b + "x", &out), StatusCode::kMalformed,
                    "handshake is 54 bytes, its header implies 53"));
  EXPECT_TRUE(Fails(decode(b.substr(0, b.size() - 1), &out), StatusCode::kMalformed,
                    "handshake is 52 bytes, its header implies 53"));
}

TEST(RdmaHandshake, DecodeRejectsEachBadField) {
  struct Case {
    size_t at;
    uint8_t value;
    StatusCode code;
    const char* message;
  };
  const Case cases[] = {
      {21, 0, StatusCode::kInvalidValue, "port_num must be at least 1"},
      {22, 0, StatusCode::kOutOfRange, "path_mtu 0 is out of range 1..5"},
      {22, 6, StatusCode::kOutOfRange, "path_mtu 6 is out of range 1..5"},
      {23, 3, StatusCode::kOutOfRange, "gid_type 3 is out of range 0..2"},
      {24, 0, StatusCode::kInvalidValue, "max_rd_atomic must be at least 1"},
      {31, 1, StatusCode::kOutOfRange, "qpn[0] 16777233 exceeds 24 bits"},
      {43, 1, StatusCode::kOutOfRange, "psn[1] 33554431 exceeds 24 bits"},
  };
  for (const Case& c : cases) {
    std::string b = encode_rdma_handshake(sample());
    b[c.at] = static_cast<char>(c.value);
    RdmaHandshake out;
    EXPECT_TRUE(Fails(decode(b, &out), c.code, c.message)) << "byte " << c.at;
  }
}

TEST(RdmaHandshake, DecodeRejectsCountsOutOfRange) {
  RdmaHandshake r = sample();
  r.qpn.clear();
  r.psn.clear();
  RdmaHandshake out;
  EXPECT_TRUE(Fails(decode(encode_rdma_handshake(r), &out), StatusCode::kInvalidValue,
                    "qp_count must be at least 1"));
  r = sample();
  r.qpn.assign(65, 1);
  r.psn.assign(65, 1);
  EXPECT_TRUE(Fails(decode(encode_rdma_handshake(r), &out), StatusCode::kTooLarge,
                    "65 QPs, limit 64"));
  r = sample();
  r.agent.clear();
  EXPECT_TRUE(Fails(decode(encode_rdma_handshake(r), &out), StatusCode::kInvalidValue,
                    "agent must not be empty"));
  r.agent.assign(300, 'a');
  EXPECT_TRUE(Fails(decode(encode_rdma_handshake(r), &out), StatusCode::kTooLarge,
                    "agent is 300 bytes, limit 256"));
}

TEST(RdmaHandshake, ValidateRejectsMismatchedLists) {
  RdmaHandshake r = sample();
  r.psn.push_back(1);
  EXPECT_TRUE(Fails(validate_rdma_handshake(r), StatusCode::kInvalidValue,
                    "qpn and psn have 2 and 3 items"));
}

TEST(RdmaRegionKey, RoundTripsAndRejectsBadInput) {
  const RdmaRegionKey key{0xdeadbeef, 0x00007f0012345678ull};
  const std::string b = encode_rdma_region_key(key);
  ASSERT_EQ(b.size(), kRdmaRegionKeyBytes);
  EXPECT_EQ(static_cast<uint8_t>(b[0]), 1);
  EXPECT_EQ(static_cast<uint8_t>(b[1]), 0xef);
  EXPECT_EQ(static_cast<uint8_t>(b[5]), 0x78);
  RdmaRegionKey back;
  ASSERT_TRUE(decode_rdma_region_key(std::as_bytes(std::span(b)), &back));
  EXPECT_EQ(back, key);
  const std::string shorter = b.substr(0, 5);
  EXPECT_TRUE(Fails(decode_rdma_region_key(std::as_bytes(std::span(shorter)), &back),
                    StatusCode::kMalformed, "region key is 5 bytes, expected 13"));
  std::string v2 = b;
  v2[0] = 2;
  EXPECT_TRUE(Fails(decode_rdma_region_key(std::as_bytes(std::span(v2)), &back),
                    StatusCode::kInvalidValue, "unsupported region key version 2"));
}

// The fuzzer's seeds (tests/fuzz/corpus/rdma_handshake/) are accepted records; the RoCE ones carry
// the IPv4-mapped GID ::ffff:127.0.10.1 (a GID is exchanged, never connected to).
TEST(RdmaHandshake, SeedCorpusDecodes) {
  const std::string dir = pdr::test::source_path("tests/fuzz/corpus/rdma_handshake/");
  auto read = [&](const char* name) {
    std::ifstream f(dir + name + ".bin", std::ios::binary);
    EXPECT_TRUE(f) << name;
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::array<uint8_t, 16> mapped = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 10, 1};
  for (const char* name : {"ib_lid", "max_qps", "roce_v2_1qp", "roce_v2_4qp"}) {
    RdmaHandshake r;
    const Status s = decode(read(name), &r);
    ASSERT_TRUE(s.is_ok()) << name << ": " << s.to_string();
    EXPECT_TRUE(validate_rdma_handshake(r).is_ok()) << name;
    if (std::string_view(name) != "ib_lid") {
      EXPECT_EQ(r.gid, mapped) << name;
    }
  }
  const std::string key = read("region_key");
  ASSERT_FALSE(key.empty());
  RdmaRegionKey k;
  EXPECT_TRUE(decode_rdma_region_key(std::as_bytes(std::span(key)).subspan(1), &k).is_ok());
}

}  // namespace
}  // namespace pdr::proto
