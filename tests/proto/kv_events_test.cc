#include "proto/kv_events.h"

#include <gtest/gtest.h>
#include <msgpack.hpp>

#include <fstream>
#include <functional>
#include <iterator>
#include <span>
#include <string>
#include <vector>

namespace pdr::proto {
namespace {

std::span<const std::byte> bytes_of(const std::string& s) { return std::as_bytes(std::span(s.data(), s.size())); }

std::string pack(const msgpack::object& o) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, o);
  return std::string(buf.data(), buf.size());
}

// Builds msgpack payloads shaped as vLLM's (API_FACTS.md 2.2).
class Writer {
 public:
  msgpack::packer<msgpack::sbuffer>& p() { return packer_; }
  std::string str() const { return std::string(buf_.data(), buf_.size()); }
  void s(std::string_view text) {
    packer_.pack_str(static_cast<uint32_t>(text.size()));
    packer_.pack_str_body(text.data(), static_cast<uint32_t>(text.size()));
  }
  void tokens(uint32_t first, uint32_t count) {
    packer_.pack_array(count);
    for (uint32_t i = 0; i < count; ++i) packer_.pack_uint32(first + i);
  }

 private:
  msgpack::sbuffer buf_;
  msgpack::packer<msgpack::sbuffer> packer_{buf_};
};

Status decode(const std::string& payload, KvEventBatch* batch, const KvEventLimits& limits = {}) {
  return decode_kv_event_batch(bytes_of(payload), limits, batch);
}

TEST(KvEvents, ArrayEventsInATwoSlotBatch) {
  // Older vLLM: [ts, events], each event positional with the tag first.
  Writer w;
  w.p().pack_array(2);
  w.p().pack_double(1764115200.5);
  w.p().pack_array(1);
  w.p().pack_array(7);
  w.s("BlockStored");
  w.p().pack_array(2);
  w.p().pack_uint64(0xFFFFFFFFFFFFFFF0ull);
  w.p().pack_uint64(12345);
  w.p().pack_nil();  // parent: sequence start
  w.tokens(100, 32);
  w.p().pack_uint32(16);
  w.p().pack_nil();  // lora_id
  w.s("GPU");
  KvEventBatch b;
  ASSERT_TRUE(decode(w.str(), &b).is_ok());
  EXPECT_DOUBLE_EQ(b.ts, 1764115200.5);
  EXPECT_FALSE(b.dp_rank.has_value());
  ASSERT_EQ(b.events.size(), 1u);
  const KvEvent& e = b.events[0];
  EXPECT_EQ(e.kind, KvEventKind::kBlockStored);
  EXPECT_EQ(e.block_hashes, (std::vector<EngineHash>{0xFFFFFFFFFFFFFFF0ull, 12345}));
  EXPECT_FALSE(e.parent_block_hash.has_value());
  ASSERT_EQ(e.token_ids.size(), 32u);
  EXPECT_EQ(e.token_ids[31], 131u);
  EXPECT_EQ(e.block_size, 16u);
  EXPECT_EQ(e.medium, "GPU");
  EXPECT_FALSE(e.has_extra_keys);
  EXPECT_EQ(b.unknown_fields, 0u);
  EXPECT_EQ(b.unknown_events, 0u);
}

TEST(KvEvents, MapEventsWithDpRankAndExtraKeys) {
  // vLLM >= 0.26: events are maps tagged by "type"; the batch stays an array with dp_rank.
  Writer w;
  w.p().pack_array(3);
  w.p().pack_double(1.0);
  w.p().pack_array(3);
  w.p().pack_map(8);
  w.s("type"), w.s("BlockStored");
  w.s("block_hashes"), w.p().pack_array(1), w.p().pack_uint64(7);
  w.s("parent_block_hash"), w.p().pack_uint64(6);
  w.s("token_ids"), w.tokens(0, 16);
  w.s("block_size"), w.p().pack_uint32(16);
  w.s("medium"), w.s("CPU");
  w.s("extra_keys"), w.p().pack_array(1), w.p().pack_array(1), w.s("img-1");
  w.s("locality"), w.s("local");  // a field this decoder does not read
  w.p().pack_map(3);
  w.s("type"), w.s("BlockRemoved");
  w.s("block_hashes"), w.p().pack_array(1), w.p().pack_uint64(7);
  w.s("group_idx"), w.p().pack_uint32(1);
  w.p().pack_map(1);
  w.s("type"), w.s("AllBlocksCleared");
  w.p().pack_uint32(3);  // dp_rank
  KvEventBatch b;
  const Status s = decode(w.str(), &b);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(b.dp_rank, 3);
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_EQ(b.events[0].parent_block_hash, 6u);
  EXPECT_EQ(b.events[0].medium, "CPU");
  EXPECT_TRUE(b.events[0].has_extra_keys);
  EXPECT_EQ(b.events[1].kind, KvEventKind::kBlockRemoved);
  EXPECT_EQ(b.events[1].block_hashes, std::vector<EngineHash>{7});
  EXPECT_EQ(b.events[1].group_idx, 1);
  EXPECT_EQ(b.events[2].kind, KvEventKind::kAllBlocksCleared);
  EXPECT_EQ(b.unknown_fields, 1u);
}

TEST(KvEvents, RawDigestHashesFoldToTheIntegerForm) {
  // VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 sends the digest bytes; =1 sends
  // int.from_bytes(digest, "big") & (2**64 - 1). Both must give the same EngineHash.
  std::string digest(32, '\0');
  for (size_t i = 0; i < digest.size(); ++i) digest[i] = static_cast<char>(i * 7 + 1);
  uint64_t low64 = 0;
  for (size_t i = 24; i < 32; ++i) low64 = (low64 << 8) | static_cast<uint8_t>(digest[i]);
  Writer w;
  w.p().pack_array(3);
  w.p().pack_double(1.0);
  w.p().pack_array(1);
  w.p().pack_array(4);
  w.s("BlockRemoved");
  w.p().pack_array(2);
  w.p().pack_bin(32), w.p().pack_bin_body(digest.data(), 32);
  w.p().pack_uint64(low64);
  w.s("GPU");
  w.p().pack_nil();
  w.p().pack_nil();
  KvEventBatch b;
  ASSERT_TRUE(decode(w.str(), &b).is_ok());
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.events[0].block_hashes[0], low64);
  EXPECT_EQ(b.events[0].block_hashes[1], low64);
}

TEST(KvEvents, UnknownEventTypesAndTrailingFieldsAreCountedNotFatal) {
  Writer w;
  w.p().pack_array(3);
  w.p().pack_double(1.0);
  w.p().pack_array(3);
  w.p().pack_array(2), w.s("SomethingNew"), w.p().pack_uint32(1);
  w.p().pack_map(2), w.s("type"), w.s("Other"), w.s("x"), w.p().pack_uint32(1);
  w.p().pack_array(14);  // BlockRemoved with 10 trailing fields from a future version
  w.s("BlockRemoved");
  w.p().pack_array(0);
  for (int i = 0; i < 12; ++i) w.p().pack_nil();
  w.p().pack_nil();
  KvEventBatch b;
  ASSERT_TRUE(decode(w.str(), &b).is_ok());
  EXPECT_EQ(b.unknown_events, 2u);
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.unknown_fields, 10u);
}

struct BadCase {
  const char* name;
  std::string payload;
  StatusCode code;
  const char* message_part;
};

std::string stored_with(const std::function<void(Writer&)>& fields, uint32_t n_fields) {
  Writer w;
  w.p().pack_array(2);
  w.p().pack_double(1.0);
  w.p().pack_array(1);
  w.p().pack_array(n_fields);
  w.s("BlockStored");
  fields(w);
  return w.str();
}

TEST(KvEvents, BadBatchesAreRefusedPreciselyAndLeaveNothing) {
  std::vector<BadCase> cases;
  cases.push_back({"not msgpack", std::string("\xc1", 1), StatusCode::kMalformed, "invalid msgpack"});
  cases.push_back({"trailing bytes", pack(msgpack::object(7)) + "x", StatusCode::kMalformed, "trailing"});
  {
    Writer w;
    w.p().pack_map(0);
    cases.push_back({"batch is a map", w.str(), StatusCode::kWrongType, "must be an array"});
  }
  cases.push_back({"hashes not an array", stored_with([](Writer& w) {
                     w.s("x"), w.p().pack_nil(), w.tokens(0, 16), w.p().pack_uint32(16);
                   }, 5),
                   StatusCode::kWrongType, "event 0 block_hashes must be an array"});
  cases.push_back({"negative token", stored_with([](Writer& w) {
                     w.p().pack_array(1), w.p().pack_uint32(1), w.p().pack_nil();
                     w.p().pack_array(1), w.p().pack_int32(-5), w.p().pack_uint32(16);
                   }, 5),
                   StatusCode::kOutOfRange, "event 0 token_ids"});
  cases.push_back({"block size 0", stored_with([](Writer& w) {
                     w.p().pack_array(0), w.p().pack_nil(), w.p().pack_array(0), w.p().pack_uint32(0);
                   }, 5),
                   StatusCode::kOutOfRange, "event 0 block_size"});
  cases.push_back({"block size missing", stored_with([](Writer& w) {
                     w.p().pack_array(0), w.p().pack_nil(), w.p().pack_array(0);
                   }, 4),
                   StatusCode::kMissingKey, "event 0 block_size is required"});
  cases.push_back({"hash too long", stored_with([](Writer& w) {
                     const std::string big(65, 'h');
                     w.p().pack_array(1), w.p().pack_bin(65), w.p().pack_bin_body(big.data(), 65);
                     w.p().pack_nil(), w.p().pack_array(0), w.p().pack_uint32(16);
                   }, 5),
                   StatusCode::kOutOfRange, "65-byte hash"});
  {
    Writer w;
    w.p().pack_array(3);
    w.p().pack_double(1.0);
    w.p().pack_array(0);
    w.p().pack_int32(-1);
    cases.push_back({"negative dp rank", w.str(), StatusCode::kOutOfRange, "dp_rank -1"});
  }
  {
    // A good event first: a failed batch must not leave it behind to be applied.
    Writer w;
    w.p().pack_array(2);
    w.p().pack_double(1.0);
    w.p().pack_array(2);
    w.p().pack_array(1), w.s("AllBlocksCleared");
    w.p().pack_map(1), w.s("block_hashes"), w.p().pack_array(0);
    cases.push_back({"map event without type", w.str(), StatusCode::kMissingKey, "event 1 type is required"});
  }
  for (const BadCase& c : cases) {
    KvEventBatch b;
    const Status s = decode(c.payload, &b);
    EXPECT_EQ(s.code(), c.code) << c.name << ": " << s.to_string();
    EXPECT_NE(s.message().find(c.message_part), std::string::npos) << c.name << ": " << s.to_string();
    EXPECT_TRUE(b.events.empty()) << c.name;
  }
}

TEST(KvEvents, LimitsAreEnforcedBeforeAnythingIsKept) {
  KvEventLimits limits;
  limits.max_events = 2;
  limits.max_tokens = 8;
  Writer w;
  w.p().pack_array(2);
  w.p().pack_double(1.0);
  w.p().pack_array(3);
  for (int i = 0; i < 3; ++i) w.p().pack_array(1), w.s("AllBlocksCleared");
  KvEventBatch b;
  Status s = decode(w.str(), &b, limits);
  EXPECT_EQ(s.code(), StatusCode::kTooLarge) << s.to_string();
  EXPECT_NE(s.message().find("3 events, limit 2"), std::string::npos) << s.to_string();

  const std::string many_tokens = stored_with([](Writer& x) {
    x.p().pack_array(1), x.p().pack_uint32(1), x.p().pack_nil(), x.tokens(0, 9), x.p().pack_uint32(9);
  }, 5);
  s = decode(many_tokens, &b, limits);
  EXPECT_EQ(s.code(), StatusCode::kTooLarge) << s.to_string();
  EXPECT_NE(s.message().find("token_ids has 9 entries, limit 8"), std::string::npos) << s.to_string();

  limits.max_payload_bytes = 4;
  s = decode(many_tokens, &b, limits);
  EXPECT_EQ(s.code(), StatusCode::kTooLarge) << s.to_string();
}

TEST(KvEvents, SeqFramesAreEightBytesBigEndian) {
  EXPECT_EQ(encode_kv_event_seq(0x0102030405060708ull), std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  uint64_t seq = 0;
  const std::string frame = encode_kv_event_seq(258);
  ASSERT_TRUE(decode_kv_event_seq(bytes_of(frame), &seq).is_ok());
  EXPECT_EQ(seq, 258u);
  const std::string end(8, '\xff');  // the replay's end marker: -1 as a signed 8-byte integer
  ASSERT_TRUE(decode_kv_event_seq(bytes_of(end), &seq).is_ok());
  EXPECT_EQ(seq, kKvReplayEnd);
  EXPECT_EQ(decode_kv_event_seq(bytes_of(std::string(7, '\0')), &seq).code(), StatusCode::kMalformed);
}

// The fuzzer's seed corpus is written by Python's msgpack (tests/fuzz/make_kv_events_corpus.py),
// an encoder other than the one above: every seed decodes.
TEST(KvEvents, PythonEncodedSeedsDecode) {
  const std::string dir = std::string(PDR_SOURCE_DIR) + "/tests/fuzz/corpus/kv_events/";
  const std::pair<const char*, size_t> seeds[] = {{"array_two_slot", 1}, {"array_dp_rank", 3}, {"map_events", 3},
                                                  {"raw_hashes", 1}, {"unknown_event", 0}};
  for (const auto& [name, events] : seeds) {
    std::ifstream f(dir + name + ".msgpack", std::ios::binary);
    ASSERT_TRUE(f) << name;
    const std::string payload((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    KvEventBatch b;
    const Status s = decode(payload, &b);
    ASSERT_TRUE(s.is_ok()) << name << ": " << s.to_string();
    EXPECT_EQ(b.events.size(), events) << name;
  }
}

}  // namespace
}  // namespace pdr::proto
