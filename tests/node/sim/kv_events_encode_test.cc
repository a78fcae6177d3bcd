// The sim's KV events, decoded by the router's decoder (proto/kv_events.h): both encodings,
// every event type.
#include "node/sim/kv_events_encode.h"

#include <gtest/gtest.h>

#include "node/sim/aux_api.h"
#include "node/sim/prompt_tokens.h"
#include "proto/kv_events.h"

namespace pdr::node::sim {
namespace {

proto::KvEventBatch decode(const std::string& payload) {
  proto::KvEventBatch batch;
  Status s = proto::decode_kv_event_batch(
      {reinterpret_cast<const std::byte*>(payload.data()), payload.size()}, {}, &batch);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return batch;
}

class EncodeTest : public ::testing::TestWithParam<KvEventsEncoding> {};

TEST_P(EncodeTest, StoredAndRemovedDecodeAsSent) {
  PrefixCacheChange removed{.stored = false, .hashes = {0xFFFFFFFFFFFFFFF0ull, 7}};
  PrefixCacheChange first{.stored = true, .hashes = {11, 12}, .tokens = {1, 2, 3, 4}};
  PrefixCacheChange next{.stored = true, .hashes = {13}, .parent = 12, .tokens = {5, 6}};
  const std::vector<PrefixCacheChange> changes = {removed, first, next};
  const proto::KvEventBatch batch =
      decode(encode_sim_kv_batch(1764115200.5, 3, GetParam(), 2, changes));
  EXPECT_DOUBLE_EQ(batch.ts, 1764115200.5);
  EXPECT_EQ(batch.dp_rank, 3);
  EXPECT_EQ(batch.unknown_events, 0u);
  EXPECT_EQ(batch.unknown_fields, 0u);
  ASSERT_EQ(batch.events.size(), 3u);
  EXPECT_EQ(batch.events[0].kind, proto::KvEventKind::kBlockRemoved);
  EXPECT_EQ(batch.events[0].block_hashes, removed.hashes);
  EXPECT_EQ(batch.events[0].medium, "GPU");
  const proto::KvEvent& s1 = batch.events[1];
  EXPECT_EQ(s1.kind, proto::KvEventKind::kBlockStored);
  EXPECT_EQ(s1.block_hashes, first.hashes);
  EXPECT_FALSE(s1.parent_block_hash.has_value());
  EXPECT_EQ(s1.token_ids, first.tokens);
  EXPECT_EQ(s1.block_size, 2u);
  EXPECT_EQ(s1.medium, "GPU");
  EXPECT_FALSE(s1.lora_name.has_value());
  EXPECT_FALSE(s1.has_extra_keys());
  EXPECT_FALSE(s1.group_idx.has_value());
  EXPECT_EQ(batch.events[2].parent_block_hash, 12u);
}

TEST_P(EncodeTest, AllBlocksCleared) {
  const proto::KvEventBatch batch = decode(encode_sim_kv_cleared_batch(2.0, 0, GetParam()));
  ASSERT_EQ(batch.events.size(), 1u);
  EXPECT_EQ(batch.events[0].kind, proto::KvEventKind::kAllBlocksCleared);
  EXPECT_EQ(batch.dp_rank, 0);
}

INSTANTIATE_TEST_SUITE_P(Encodings, EncodeTest,
                         ::testing::Values(KvEventsEncoding::kMap, KvEventsEncoding::kArray));

// A hybrid model's groups: each stored run once per group, the groups with a window removing the
// blocks they slid past; evictions in every group.
TEST_P(EncodeTest, GroupsPublishEachChangeOncePerGroup) {
  SimKvEventsShape shape;
  shape.encoding = GetParam();
  std::string why;
  ASSERT_TRUE(parse_kv_events_groups("full_attention,sliding_window:5,mamba:1", &shape.groups, &why)) << why;
  PrefixCacheChange run{.stored = true, .hashes = {1, 2, 3, 4}, .tokens = {1, 2, 3, 4, 5, 6, 7, 8}};
  PrefixCacheChange evicted{.stored = false, .hashes = {9}};
  const std::vector<PrefixCacheChange> changes = {run, evicted};
  const proto::KvEventBatch batch = decode(encode_sim_kv_batch(1.0, 0, shape, 2, changes));
  EXPECT_EQ(batch.unknown_fields, 0u);
  // full: stored; sliding (5 tokens: 3 blocks kept): stored, removed 1; mamba (1 token: the last
  // block kept): stored, removed 3; the eviction x 3.
  ASSERT_EQ(batch.events.size(), 8u);
  const proto::KvEvent& full = batch.events[0];
  EXPECT_EQ(full.group_idx, 0);
  EXPECT_EQ(full.kv_cache_spec_kind, "full_attention");
  EXPECT_FALSE(full.kv_cache_spec_sliding_window.has_value());
  EXPECT_EQ(full.token_ids, run.tokens);
  EXPECT_EQ(batch.events[1].group_idx, 1);
  EXPECT_EQ(batch.events[1].kv_cache_spec_kind, "sliding_window");
  EXPECT_EQ(batch.events[1].kv_cache_spec_sliding_window, 5);
  EXPECT_EQ(batch.events[2].kind, proto::KvEventKind::kBlockRemoved);
  EXPECT_EQ(batch.events[2].group_idx, 1);
  EXPECT_EQ(batch.events[2].block_hashes, std::vector<uint64_t>{1});
  EXPECT_EQ(batch.events[3].kv_cache_spec_kind, "mamba");
  EXPECT_EQ(batch.events[4].block_hashes, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(batch.events[4].group_idx, 2);
  for (size_t i = 5; i < 8; ++i) {
    EXPECT_EQ(batch.events[i].kind, proto::KvEventKind::kBlockRemoved);
    EXPECT_EQ(batch.events[i].block_hashes, std::vector<uint64_t>{9});
    EXPECT_EQ(batch.events[i].group_idx, static_cast<int64_t>(i - 5));
  }
}

// A CPU tier: each stored run again with medium CPU, in the full-attention groups only;
// self-describing or as the connector's tokenless placeholder.
TEST_P(EncodeTest, CpuTierStoresFollowEachRun) {
  SimKvEventsShape shape;
  shape.encoding = GetParam();
  std::string why;
  ASSERT_TRUE(parse_kv_events_groups("full_attention,sliding_window:64", &shape.groups, &why)) << why;
  PrefixCacheChange run{.stored = true, .hashes = {5, 6}, .parent = 4, .tokens = {1, 2, 3, 4}};
  for (SimCpuTier tier : {SimCpuTier::kSelfDescribing, SimCpuTier::kPlaceholder}) {
    shape.cpu_tier = tier;
    const proto::KvEventBatch batch = decode(encode_sim_kv_batch(1.0, 0, shape, 2, {&run, 1}));
    ASSERT_EQ(batch.events.size(), 3u);  // GPU x 2 groups (no slide: the window holds the run), CPU x 1
    const proto::KvEvent& cpu = batch.events[2];
    EXPECT_EQ(cpu.medium, "CPU");
    EXPECT_EQ(cpu.group_idx, 0);
    EXPECT_EQ(cpu.block_hashes, run.hashes);
    if (GetParam() == KvEventsEncoding::kMap) {
      EXPECT_EQ(cpu.locality, "LOCAL");
    }
    if (tier == SimCpuTier::kSelfDescribing) {
      EXPECT_EQ(cpu.token_ids, run.tokens);
      EXPECT_EQ(cpu.parent_block_hash, 4u);
      EXPECT_EQ(cpu.kv_cache_spec_kind, "full_attention");
    } else {
      EXPECT_TRUE(cpu.token_ids.empty());
      EXPECT_EQ(cpu.block_size, 0u);
      EXPECT_FALSE(cpu.parent_block_hash.has_value());
      EXPECT_FALSE(cpu.kv_cache_spec_kind.has_value());
    }
  }
  shape.groups.clear();  // without groups: one CPU store, no group fields
  const proto::KvEventBatch plain = decode(encode_sim_kv_batch(1.0, 0, shape, 2, {&run, 1}));
  ASSERT_EQ(plain.events.size(), 2u);
  EXPECT_EQ(plain.events[1].medium, "CPU");
  EXPECT_FALSE(plain.events[1].group_idx.has_value());
}

TEST(EncodeTest, ParsesGroupsAndTiers) {
  std::vector<SimKvGroup> groups;
  std::string why;
  EXPECT_TRUE(parse_kv_events_groups("", &groups, &why));
  EXPECT_TRUE(groups.empty());
  ASSERT_TRUE(parse_kv_events_groups("full_attention,sliding_window:4096", &groups, &why));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].kind, "sliding_window");
  EXPECT_EQ(groups[1].window_tokens, 4096u);
  for (const char* bad : {"full_attention,", "Full", "sliding_window:0", "sliding_window:x", "a:99999999999"}) {
    EXPECT_FALSE(parse_kv_events_groups(bad, &groups, &why)) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
  std::string many;
  for (int i = 0; i < 17; ++i) many += (i ? ",g" : "g");
  EXPECT_FALSE(parse_kv_events_groups(many, &groups, &why));
  SimCpuTier tier = SimCpuTier::kNone;
  EXPECT_TRUE(parse_kv_events_cpu_tier("placeholder", &tier));
  EXPECT_EQ(tier, SimCpuTier::kPlaceholder);
  EXPECT_FALSE(parse_kv_events_cpu_tier("CPU", &tier));
}

TEST(EncodeTest, MapEventsAreTaggedByType) {
  PrefixCacheChange stored{.stored = true, .hashes = {1}, .tokens = {9}};
  const std::string map = encode_sim_kv_batch(0, 0, KvEventsEncoding::kMap, 1, {&stored, 1});
  const std::string array = encode_sim_kv_batch(0, 0, KvEventsEncoding::kArray, 1, {&stored, 1});
  EXPECT_NE(map.find("\xA4type"), std::string::npos);
  EXPECT_NE(map.find("parent_block_hash"), std::string::npos);
  EXPECT_EQ(array.find("type"), std::string::npos);
}

TEST(EncodeTest, ParsesEncodingNames) {
  KvEventsEncoding e = KvEventsEncoding::kArray;
  EXPECT_TRUE(parse_kv_events_encoding("map", &e));
  EXPECT_EQ(e, KvEventsEncoding::kMap);
  EXPECT_TRUE(parse_kv_events_encoding("array", &e));
  EXPECT_EQ(e, KvEventsEncoding::kArray);
  EXPECT_FALSE(parse_kv_events_encoding("Map", &e));
}

TEST(PromptTokenIds, FollowTheSimTokenCount) {
  using nlohmann::json;
  EXPECT_EQ(prompt_token_ids(ApiKind::kCompletion, json::parse(R"({"prompt": [5, 6, 70000]})")),
            (std::vector<uint32_t>{5, 6, 70000}));
  EXPECT_EQ(prompt_token_ids(ApiKind::kCompletion, json::parse(R"({"prompt": [[1, 2], [3]]})")),
            (std::vector<uint32_t>{1, 2}));
  const auto words = prompt_token_ids(ApiKind::kCompletion, json{{"prompt", "  a b\ta  "}});
  ASSERT_EQ(words.size(), 3u);
  EXPECT_EQ(words[0], words[2]);
  EXPECT_NE(words[0], words[1]);
  for (uint32_t id : words) {
    EXPECT_GE(id, kFirstWordTokenId);
    EXPECT_LT(id, kWordTokenIdEnd);
  }
  const json chat = json::parse(R"({"messages": [{"role": "system", "content": "a b"},
      {"role": "user", "content": [{"type": "text", "text": "a"}]}]})");
  const auto chat_ids = prompt_token_ids(ApiKind::kChat, chat);
  EXPECT_EQ(chat_ids, (std::vector<uint32_t>{words[0], words[1], words[0]}));
  GenerationRequest req;
  ASSERT_FALSE(parse_generation_request(ApiKind::kChat, chat, "m", &req).has_value());
  EXPECT_EQ(req.prompt_tokens, chat_ids.size());
}

// A router that tokenizes text through a node (policies.cache_aware.tokenize: node) matches the
// blocks the sim's prefix cache hashes only if /tokenize answers the same ids.
TEST(PromptTokenIds, AreWhatTokenizeAnswers) {
  using nlohmann::json;
  EXPECT_EQ(word_token_id("the"), 0u);  // a vocabulary word: its index
  AuxContext ctx;
  ctx.served_model = "m";
  const json completion = json{{"model", "m"}, {"prompt", "the quick zebra brown"}};
  std::string out;
  ASSERT_FALSE(sim_tokenize(completion, ctx, &out).has_value());
  EXPECT_EQ(json::parse(out)["tokens"].get<std::vector<uint32_t>>(),
            prompt_token_ids(ApiKind::kCompletion, completion));
  const json chat = json::parse(R"({"messages": [{"role": "system", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "the fox"}]}]})");
  ASSERT_FALSE(sim_tokenize(chat, ctx, &out).has_value());
  const json answer = json::parse(out);
  EXPECT_EQ(answer["tokens"].get<std::vector<uint32_t>>(), prompt_token_ids(ApiKind::kChat, chat));
  EXPECT_EQ(answer["count"], 4);
}

}  // namespace
}  // namespace pdr::node::sim
