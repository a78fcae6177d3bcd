#include "node/sim/kv_wire.h"

#include <gtest/gtest.h>

namespace pdr::node::sim {
namespace {

KvMessage write_request() {
  KvMessage m;
  m.type = KvMessageType::kWriteRequest;
  m.key = "tx-42";
  m.descriptor = std::string("\0desc\xff", 6);
  m.layout = 3;
  m.block_bytes = 16384;
  m.layers = 2;
  m.blocks = {7, 8, 1000};
  return m;
}

TEST(KvWire, RoundTripsEveryType) {
  KvMessage out;
  const KvMessage w = write_request();
  ASSERT_FALSE(decode_kv_message(encode_kv_message(w), &out));
  EXPECT_EQ(out.type, KvMessageType::kWriteRequest);
  EXPECT_EQ(out.key, w.key);
  EXPECT_EQ(out.descriptor, w.descriptor);
  EXPECT_EQ(out.layout, 3u);
  EXPECT_EQ(out.block_bytes, 16384u);
  EXPECT_EQ(out.layers, 2u);
  EXPECT_EQ(out.blocks, w.blocks);

  KvMessage d;
  d.type = KvMessageType::kDescriptor;
  d.descriptor = "blob";
  d.layout = 1;
  d.block_bytes = 64;
  d.layers = 4;
  ASSERT_FALSE(decode_kv_message(encode_kv_message(d), &out));
  EXPECT_EQ(out.type, KvMessageType::kDescriptor);
  EXPECT_EQ(out.descriptor, "blob");
  EXPECT_EQ(out.layers, 4u);

  KvMessage e;
  e.type = KvMessageType::kError;
  e.error = "nope";
  ASSERT_FALSE(decode_kv_message(encode_kv_message(e), &out));
  EXPECT_EQ(out.error, "nope");

  for (KvMessageType t : {KvMessageType::kDescribe, KvMessageType::kAck}) {
    KvMessage m;
    m.type = t;
    ASSERT_FALSE(decode_kv_message(encode_kv_message(m), &out));
    EXPECT_EQ(out.type, t);
  }
}

TEST(KvWire, RefusesBadInput) {
  KvMessage out;
  const std::string good = encode_kv_message(write_request());
  EXPECT_TRUE(decode_kv_message("", &out));
  EXPECT_TRUE(decode_kv_message("XXXX\x01\x01", &out));                       // magic
  EXPECT_TRUE(decode_kv_message(std::string("PDKV\x02\x01", 6), &out));       // version
  EXPECT_TRUE(decode_kv_message(std::string("PDKV\x01\x09", 6), &out));       // type
  EXPECT_TRUE(decode_kv_message(std::string("PDKV\x01\x01\x00", 7), &out));   // trailing
  EXPECT_TRUE(decode_kv_message(good + "x", &out));                           // trailing
  for (size_t cut = 0; cut < good.size(); ++cut) {                            // every truncation
    EXPECT_TRUE(decode_kv_message(good.substr(0, cut), &out)) << cut;
  }
}

TEST(KvWire, RefusesOversizedFieldsBeforeAllocating) {
  KvMessage out;
  // A write request claiming 2^32-1 key bytes / blocks with none present.
  std::string huge_key("PDKV\x01\x03\xff\xff\xff\xff", 10);
  auto error = decode_kv_message(huge_key, &out);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("key longer"), std::string::npos) << *error;

  KvMessage m = write_request();
  m.key.assign(kMaxKvKeyBytes + 1, 'k');
  EXPECT_TRUE(decode_kv_message(encode_kv_message(m), &out));
  m = write_request();
  m.key.clear();
  EXPECT_TRUE(decode_kv_message(encode_kv_message(m), &out));  // empty key
  m = write_request();
  m.blocks.assign(kMaxKvBlocksPerMessage + 1, 1);
  error = decode_kv_message(encode_kv_message(m), &out);
  ASSERT_TRUE(error);
  EXPECT_NE(error->find("65536"), std::string::npos) << *error;
  EXPECT_TRUE(decode_kv_message(std::string(kMaxKvMessageBytes + 1, 'P'), &out));
}

}  // namespace
}  // namespace pdr::node::sim
