#include "proto/kv_events.h"
#include "tests/support/source_path.h"

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

// Builds msgpack payloads shaped as vLLM's (docs/design/kv-events.md, Payload).
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
  EXPECT_FALSE(e.has_extra_keys());
  EXPECT_FALSE(e.lora_id.has_value());
  EXPECT_FALSE(e.group_idx.has_value());
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
  w.s("owner"), w.s("x");  // a field this decoder does not read
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
  ASSERT_EQ(b.events[0].extra_keys.size(), 1u);
  EXPECT_EQ(b.events[0].extra_keys[0], kv_extra_keys_for_cache_salt("img-1"));  // the same shape: ["img-1"]
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
    cases.push_back({"batch map without fields", w.str(), StatusCode::kMissingKey, "needs ts and events"});
  }
  {
    Writer w;
    w.s("x");
    cases.push_back({"batch is a string", w.str(), StatusCode::kWrongType, "must be an array"});
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
  cases.push_back({"block size over 2^20", stored_with([](Writer& w) {
                     w.p().pack_array(0), w.p().pack_nil(), w.p().pack_array(0), w.p().pack_uint32(1u << 21);
                   }, 5),
                   StatusCode::kOutOfRange, "event 0 block_size"});
  cases.push_back({"group_idx negative", stored_with([](Writer& w) {
                     w.p().pack_array(0), w.p().pack_nil(), w.p().pack_array(0), w.p().pack_uint32(16);
                     w.p().pack_nil(), w.s("GPU"), w.p().pack_nil(), w.p().pack_nil(), w.p().pack_int32(-1);
                   }, 10),
                   StatusCode::kOutOfRange, "event 0 group_idx -1"});
  cases.push_back({"group_idx huge", stored_with([](Writer& w) {
                     w.p().pack_array(0), w.p().pack_nil(), w.p().pack_array(0), w.p().pack_uint32(16);
                     w.p().pack_nil(), w.s("GPU"), w.p().pack_nil(), w.p().pack_nil(), w.p().pack_uint32(65536);
                   }, 10),
                   StatusCode::kOutOfRange, "event 0 group_idx 65536"});
  cases.push_back({"extra_keys not an array", stored_with([](Writer& w) {
                     w.p().pack_array(0), w.p().pack_nil(), w.p().pack_array(0), w.p().pack_uint32(16);
                     w.p().pack_nil(), w.s("GPU"), w.p().pack_nil(), w.s("img");
                   }, 9),
                   StatusCode::kWrongType, "event 0 extra_keys must be an array"});
  cases.push_back({"kind not a string", stored_with([](Writer& w) {
                     w.p().pack_array(0), w.p().pack_nil(), w.p().pack_array(0), w.p().pack_uint32(16);
                     w.p().pack_nil(), w.s("GPU"), w.p().pack_nil(), w.p().pack_nil(), w.p().pack_uint32(0);
                     w.p().pack_uint32(3);
                   }, 11),
                   StatusCode::kWrongType, "event 0 kv_cache_spec_kind"});
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

// One legacy BlockStored per vLLM version's field list: each added field lands where it belongs
// and a shorter array leaves the later fields unset (medium in #19737, lora_name in #27577,
// extra_keys in #33304, group_idx in #37688, the group's spec in #40984).
TEST(KvEvents, LegacyArraysWithTrailingFieldsAddedOverVersions) {
  for (uint32_t fields : {6u, 7u, 8u, 9u, 10u, 12u}) {
    Writer w;
    w.p().pack_array(2);
    w.p().pack_double(1.0);
    w.p().pack_array(1);
    w.p().pack_array(fields);
    w.s("BlockStored");
    w.p().pack_array(2), w.p().pack_uint64(1), w.p().pack_uint64(2);
    w.p().pack_uint64(9);  // parent
    w.tokens(0, 8);
    w.p().pack_uint32(4);
    w.p().pack_uint32(7);                               // lora_id
    if (fields > 6) w.s("CPU");                         // medium
    if (fields > 7) w.s("adapter-a");                   // lora_name
    if (fields > 8) {                                   // extra_keys: the adapter's name, then an image
      w.p().pack_array(2);
      w.p().pack_array(1), w.s("adapter-a");
      w.p().pack_array(2), w.s("adapter-a"), w.p().pack_array(2), w.s("mm-hash"), w.p().pack_uint32(3);
    }
    if (fields > 9) w.p().pack_uint32(1);               // group_idx
    if (fields > 10) w.s("sliding_window"), w.p().pack_uint32(128);
    KvEventBatch b;
    const Status s = decode(w.str(), &b);
    ASSERT_TRUE(s.is_ok()) << fields << ": " << s.to_string();
    ASSERT_EQ(b.events.size(), 1u);
    const KvEvent& e = b.events[0];
    EXPECT_EQ(e.parent_block_hash, 9u);
    EXPECT_EQ(e.block_size, 4u);
    EXPECT_EQ(e.lora_id, 7);
    EXPECT_EQ(e.medium, fields > 6 ? "CPU" : "") << fields;
    EXPECT_EQ(e.lora_name, fields > 7 ? std::optional<std::string>("adapter-a") : std::nullopt) << fields;
    if (fields > 8) {
      // Block 0's keys were the adapter's name alone: none left. Block 1 keeps the image.
      ASSERT_EQ(e.extra_keys.size(), 2u);
      EXPECT_EQ(e.extra_keys[0], "");
      Writer image;
      image.p().pack_array(1), image.p().pack_array(2), image.s("mm-hash"), image.p().pack_uint32(3);
      EXPECT_EQ(e.extra_keys[1], image.str());
    } else {
      EXPECT_FALSE(e.has_extra_keys()) << fields;
    }
    EXPECT_EQ(e.group_idx, fields > 9 ? std::optional<int64_t>(1) : std::nullopt) << fields;
    EXPECT_EQ(e.kv_cache_spec_kind, fields > 10 ? std::optional<std::string>("sliding_window") : std::nullopt);
    EXPECT_EQ(e.kv_cache_spec_sliding_window, fields > 10 ? std::optional<int64_t>(128) : std::nullopt);
    EXPECT_EQ(b.unknown_fields, 0u) << fields;
  }
  // BlockRemoved: [tag, block_hashes], then medium, then group_idx.
  Writer w;
  w.p().pack_array(2);
  w.p().pack_double(1.0);
  w.p().pack_array(3);
  w.p().pack_array(2), w.s("BlockRemoved"), w.p().pack_array(1), w.p().pack_uint64(5);
  w.p().pack_array(3), w.s("BlockRemoved"), w.p().pack_array(1), w.p().pack_uint64(5), w.s("CPU");
  w.p().pack_array(4), w.s("BlockRemoved"), w.p().pack_array(1), w.p().pack_uint64(5), w.s("GPU"), w.p().pack_uint32(2);
  KvEventBatch b;
  ASSERT_TRUE(decode(w.str(), &b).is_ok());
  ASSERT_EQ(b.events.size(), 3u);
  EXPECT_EQ(b.events[0].medium, "");
  EXPECT_FALSE(b.events[0].group_idx.has_value());
  EXPECT_EQ(b.events[1].medium, "CPU");
  EXPECT_EQ(b.events[2].group_idx, 2);
}

// vLLM >= 0.26 (#42892): every field by name, defaulted ones omitted; newer offloading events add
// locality, ownership and session_id.
TEST(KvEvents, MapEncodingCarriesEveryField) {
  Writer w;
  w.p().pack_array(3);
  w.p().pack_double(1.0);
  w.p().pack_array(3);
  w.p().pack_map(15);
  w.s("type"), w.s("BlockStored");
  w.s("block_hashes"), w.p().pack_array(1), w.p().pack_uint64(11);
  w.s("parent_block_hash"), w.p().pack_nil();
  w.s("token_ids"), w.tokens(0, 16);
  w.s("block_size"), w.p().pack_uint32(16);
  w.s("lora_id"), w.p().pack_uint32(3);
  w.s("medium"), w.s("CPU");
  w.s("lora_name"), w.s("adapter-b");
  w.s("extra_keys"), w.p().pack_array(1), w.p().pack_array(2), w.s("adapter-b"), w.s("salt-1");
  w.s("group_idx"), w.p().pack_uint32(0);
  w.s("kv_cache_spec_kind"), w.s("full_attention");
  w.s("locality"), w.s("LOCAL");
  w.s("ownership"), w.s("tier-1");
  w.s("session_id"), w.s("s-1");
  w.s("kv_cache_spec_sliding_window"), w.p().pack_nil();
  w.p().pack_map(5);
  w.s("type"), w.s("BlockRemoved");
  w.s("block_hashes"), w.p().pack_array(1), w.p().pack_uint64(11);
  w.s("medium"), w.s("CPU");
  w.s("group_idx"), w.p().pack_uint32(2);
  w.s("locality"), w.s("REMOTE");
  // Placeholder store of an offload tier: engine keys and a tier, no tokens, block_size 0.
  w.p().pack_map(8);
  w.s("type"), w.s("BlockStored");
  w.s("block_hashes"), w.p().pack_array(1), w.p().pack_uint64(12);
  w.s("parent_block_hash"), w.p().pack_nil();
  w.s("token_ids"), w.p().pack_array(0);
  w.s("block_size"), w.p().pack_uint32(0);
  w.s("lora_id"), w.p().pack_nil();
  w.s("medium"), w.s("CPU");
  w.s("lora_name"), w.p().pack_nil();
  w.p().pack_uint32(0);
  KvEventBatch b;
  const Status s = decode(w.str(), &b);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_EQ(b.events.size(), 3u);
  const KvEvent& e = b.events[0];
  EXPECT_EQ(e.lora_id, 3);
  EXPECT_EQ(e.lora_name, "adapter-b");
  ASSERT_EQ(e.extra_keys.size(), 1u);
  EXPECT_EQ(e.extra_keys[0], kv_extra_keys_for_cache_salt("salt-1"));  // the adapter's key left out
  EXPECT_EQ(e.group_idx, 0);
  EXPECT_EQ(e.kv_cache_spec_kind, "full_attention");
  EXPECT_FALSE(e.kv_cache_spec_sliding_window.has_value());
  EXPECT_EQ(e.locality, "LOCAL");
  EXPECT_EQ(b.events[1].kind, KvEventKind::kBlockRemoved);
  EXPECT_EQ(b.events[1].medium, "CPU");
  EXPECT_EQ(b.events[1].group_idx, 2);
  EXPECT_EQ(b.events[1].locality, "REMOTE");
  EXPECT_EQ(b.events[2].block_size, 0u);
  EXPECT_TRUE(b.events[2].token_ids.empty());
  EXPECT_EQ(b.unknown_fields, 0u);  // ownership and session_id are known, not read
}

// The same extra keys give the same bytes whoever encoded them: an integer or a string header
// wider than needed re-encodes to the smallest, as the router's own keys are built. An adapter
// named by id only (older vLLM put lora_int_id first) is left out by that id.
TEST(KvEvents, ExtraKeysAreCanonicalAndWithoutTheAdaptersKey) {
  const auto one = [](const std::function<void(Writer&)>& keys, bool with_lora_id) {
    Writer w;
    w.p().pack_array(2);
    w.p().pack_double(1.0);
    w.p().pack_array(1);
    w.p().pack_array(9);
    w.s("BlockStored");
    w.p().pack_array(1), w.p().pack_uint64(1);
    w.p().pack_nil();
    w.tokens(0, 4);
    w.p().pack_uint32(4);
    if (with_lora_id) {
      w.p().pack_uint32(42);
    } else {
      w.p().pack_nil();
    }
    w.s("GPU");
    w.p().pack_nil();
    w.p().pack_array(1);
    keys(w);
    KvEventBatch b;
    EXPECT_TRUE(decode(w.str(), &b).is_ok());
    return b.events.empty() ? std::string("?") : b.events[0].extra_keys.empty() ? std::string() : b.events[0].extra_keys[0];
  };
  const std::string narrow = one([](Writer& w) { w.p().pack_array(2), w.s("img"), w.p().pack_uint8(7); }, false);
  const std::string wide = one(
      [](Writer& w) {
        w.p().pack_array(2);
        w.p().pack_str(3), w.p().pack_str_body("img", 3);  // fixstr either way
        w.p().pack_uint64(7);                              // 9 bytes on the wire, 1 canonical
      },
      false);
  EXPECT_FALSE(narrow.empty());
  EXPECT_EQ(narrow, wide);
  EXPECT_EQ(one([](Writer& w) { w.p().pack_array(2), w.p().pack_uint32(42), w.s("img"); }, true),
            kv_extra_keys_for_cache_salt("img"));
  // 42 is not the adapter's key when the event names no adapter: it stays.
  EXPECT_NE(one([](Writer& w) { w.p().pack_array(2), w.p().pack_uint32(42), w.s("img"); }, false),
            kv_extra_keys_for_cache_salt("img"));
  EXPECT_EQ(one([](Writer& w) { w.p().pack_array(1), w.p().pack_uint32(42); }, true), "");
}

// A batch without events (an engine step that changed nothing cached) is valid in every
// envelope and encoding: no events, no unknowns, no error.
TEST(KvEvents, EmptyBatchesAreValid) {
  std::vector<std::string> payloads;
  {
    Writer w;
    w.p().pack_array(2), w.p().pack_double(1.0), w.p().pack_array(0);
    payloads.push_back(w.str());
  }
  {
    Writer w;
    w.p().pack_array(3), w.p().pack_double(1.0), w.p().pack_array(0), w.p().pack_uint32(1);
    payloads.push_back(w.str());
  }
  {
    Writer w;
    w.p().pack_array(3), w.p().pack_double(1.0), w.p().pack_array(0), w.p().pack_nil();
    payloads.push_back(w.str());
  }
  {
    Writer w;  // the batch struct encoded by name
    w.p().pack_map(3);
    w.s("ts"), w.p().pack_double(1.0);
    w.s("events"), w.p().pack_array(0);
    w.s("data_parallel_rank"), w.p().pack_uint32(1);
    payloads.push_back(w.str());
  }
  for (size_t i = 0; i < payloads.size(); ++i) {
    KvEventBatch b;
    const Status s = decode(payloads[i], &b);
    ASSERT_TRUE(s.is_ok()) << i << ": " << s.to_string();
    EXPECT_TRUE(b.events.empty()) << i;
    EXPECT_EQ(b.unknown_events, 0u) << i;
    EXPECT_EQ(b.unknown_fields, 0u) << i;
  }
}

// msgspec encodes a batch struct without array_like as a map: its events decode as usual.
TEST(KvEvents, BatchEncodedAsAMap) {
  Writer w;
  w.p().pack_map(4);
  w.s("ts"), w.p().pack_double(2.5);
  w.s("events"), w.p().pack_array(1), w.p().pack_map(1), w.s("type"), w.s("AllBlocksCleared");
  w.s("data_parallel_rank"), w.p().pack_uint32(2);
  w.s("extra"), w.p().pack_nil();
  KvEventBatch b;
  const Status s = decode(w.str(), &b);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_DOUBLE_EQ(b.ts, 2.5);
  EXPECT_EQ(b.dp_rank, 2);
  ASSERT_EQ(b.events.size(), 1u);
  EXPECT_EQ(b.unknown_fields, 1u);
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
  const std::string dir = pdr::test::source_path("tests/fuzz/corpus/kv_events/");
  const std::pair<const char*, size_t> seeds[] = {
      {"array_two_slot", 1}, {"array_dp_rank", 3},  {"map_events", 3},     {"raw_hashes", 1},
      {"unknown_event", 0},  {"array_hybrid_lora", 3}, {"map_tiers_salt", 4}, {"empty_two_slot", 0},
      {"empty_dp_rank", 0},  {"map_batch", 1},       {"map_batch_empty", 0}};
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
