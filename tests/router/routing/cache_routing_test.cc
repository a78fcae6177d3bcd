#include "router/routing/cache_routing.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "discovery/instance.h"
#include "proto/kv_events.h"
#include "router/cache/block_index.h"
#include "router/cache/prefix_tree.h"
#include "router/proxy/proxy_shared.h"

namespace pdr::router::routing {
namespace {

constexpr const char* kPrefillA = "127.0.20.1:8000";
constexpr const char* kPrefillB = "127.0.20.2:8000";
constexpr const char* kDecode = "127.0.20.3:8000";

proto::JsonObjectBody parse(std::string text) {
  proto::JsonObjectBody body;
  EXPECT_TRUE(proto::JsonObjectBody::parse_owned(std::move(text), proto::JsonLimits{}, &body).is_ok());
  return body;
}

config::Topology cache_aware_topology() {
  config::Topology t;
  t.policies.prefill = config::PolicyName::kCacheAware;
  t.policies.decode = config::PolicyName::kCacheAware;
  return t;
}

InstancePtr instance(const char* key, proto::Role role) {
  auto i = std::make_shared<discovery::Instance>();
  i->key = key;
  i->role = role;
  return i;
}

// `node` stored the blocks of tokens [0, 4 * blocks) (block size 4), for adapter `lora` (none:
// the base model), on `medium`, with the first block's extra keys `first_extra`.
void store(cache::BlockIndex& index, const char* node, uint32_t blocks, std::optional<std::string> lora = std::nullopt,
           std::string medium = "GPU", std::string first_extra = "") {
  proto::KvEvent e;
  e.kind = proto::KvEventKind::kBlockStored;
  e.block_size = 4;
  e.medium = std::move(medium);
  e.lora_name = std::move(lora);
  if (!first_extra.empty()) {
    e.extra_keys.assign(blocks, "");
    e.extra_keys[0] = std::move(first_extra);
  }
  for (uint32_t b = 0; b < blocks; ++b) {
    e.block_hashes.push_back(1000 + b);
    for (uint32_t t = 0; t < 4; ++t) e.token_ids.push_back(4 * b + t);
  }
  proto::KvEventBatch batch;
  batch.events.push_back(std::move(e));
  index.apply(node, 0, batch);
}

std::string token_prompt(uint32_t count) {
  std::string out = "{\"model\":\"m\",\"prompt\":[";
  for (uint32_t t = 0; t < count; ++t) out += (t ? "," : "") + std::to_string(t);
  return out + "]}";
}

TEST(CacheRouting, NothingWithoutACacheAwarePolicy) {
  RoutingShared shared;
  cache::PrefixTree tree;
  shared.prefix_tree = &tree;
  const auto body = parse(R"({"prompt":"hello"})");
  EXPECT_FALSE(lookup_cache(body, "", config::Topology{}, shared).has_value());
  auto t = cache_aware_topology();
  t.policies.decode = config::PolicyName::kRoundRobin;  // one role is enough
  EXPECT_TRUE(lookup_cache(body, "", t, shared).has_value());
  EXPECT_FALSE(lookup_cache(parse(R"({"model":"m"})"), "", t, shared).has_value());  // no prompt
}

TEST(CacheRouting, TokenIdPromptsMatchTheKvEventsExactly) {
  RoutingShared shared;
  cache::BlockIndex index;
  cache::PrefixTree tree;
  shared.block_index = &index;
  shared.prefix_tree = &tree;
  store(index, kPrefillA, 2);
  store(index, kPrefillB, 5);
  const auto body = parse(token_prompt(22));  // 5 full blocks and 2 tokens
  auto routing = lookup_cache(body, "m", cache_aware_topology(), shared);
  ASSERT_TRUE(routing.has_value());
  EXPECT_EQ(routing->hits.source, CacheHits::Source::kKvEvents);
  EXPECT_EQ(routing->hits.prompt_units, 22u);
  EXPECT_EQ(routing->hits.matched(kPrefillA), 8u);
  EXPECT_EQ(routing->hits.matched(kPrefillB), 20u);
  EXPECT_EQ(routing->hits.matched(kDecode), 0u);
}

// vLLM serves an adapter under its name: a request naming an adapter the events named matches
// only that adapter's blocks, never the base model's (which the engine would not reuse for it).
TEST(CacheRouting, AnAdaptersRequestMatchesOnlyItsBlocks) {
  RoutingShared shared;
  cache::BlockIndex index;
  shared.block_index = &index;
  store(index, kPrefillA, 5);                 // the base model's
  store(index, kPrefillB, 2, "adapter-x");    // the adapter's
  store(index, kDecode, 3, "adapter-y");
  const auto body = parse(token_prompt(20));
  auto routing = lookup_cache(body, "adapter-x", cache_aware_topology(), shared);
  ASSERT_TRUE(routing.has_value());
  EXPECT_EQ(routing->hits.source, CacheHits::Source::kKvEvents);
  EXPECT_EQ(routing->hits.matched(kPrefillB), 8u);
  EXPECT_EQ(routing->hits.matched(kPrefillA), 0u);
  EXPECT_EQ(routing->hits.matched(kDecode), 0u);
  // The base model's name (or none) matches the base model's blocks only.
  for (std::string_view model : {"base-model", ""}) {
    routing = lookup_cache(body, model, cache_aware_topology(), shared);
    ASSERT_TRUE(routing.has_value());
    EXPECT_EQ(routing->hits.matched(kPrefillA), 20u) << model;
    EXPECT_EQ(routing->hits.matched(kPrefillB), 0u) << model;
  }
  // An adapter the events named whose blocks nobody holds for this prompt: no exact hit at all
  // (the base model's blocks are not its own), so the prefix tree answers.
  store(index, kDecode, 1, "adapter-z");
  index.apply(kDecode, 0, [] {
    proto::KvEventBatch b;
    proto::KvEvent clear;
    clear.kind = proto::KvEventKind::kAllBlocksCleared;
    b.events.push_back(clear);
    return b;
  }());
  routing = lookup_cache(body, "adapter-z", cache_aware_topology(), shared);
  ASSERT_TRUE(routing.has_value());
  EXPECT_EQ(routing->hits.source, CacheHits::Source::kPrefixTree);
  EXPECT_EQ(routing->hits.matched(kPrefillA), 0u);
}

// A salted request matches only blocks of its salt; CPU-tier blocks count at a discount.
TEST(CacheRouting, CacheSaltAndOffloadTiersShapeTheMatch) {
  RoutingShared shared;
  cache::BlockIndex index;
  shared.block_index = &index;
  store(index, kPrefillA, 4);
  store(index, kPrefillB, 4, std::nullopt, "GPU", proto::kv_extra_keys_for_cache_salt("tenant-1"));
  store(index, kDecode, 4, std::nullopt, "CPU");
  auto routing = lookup_cache(parse(R"({"cache_salt":"tenant-1","prompt":[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]})"),
                              "m", cache_aware_topology(), shared);
  ASSERT_TRUE(routing.has_value());
  EXPECT_EQ(routing->hits.matched(kPrefillB), 16u);
  EXPECT_EQ(routing->hits.matched(kPrefillA), 0u);
  routing = lookup_cache(parse(token_prompt(16)), "m", cache_aware_topology(), shared);
  ASSERT_TRUE(routing.has_value());
  EXPECT_EQ(routing->hits.matched(kPrefillA), 16u);
  EXPECT_EQ(routing->hits.matched(kPrefillB), 0u);
  EXPECT_EQ(routing->hits.matched(kDecode), 16u * cache::kOffloadWeightPercent / 100);
}

TEST(CacheRouting, TextPromptsMatchWhereEarlierPromptsWent) {
  RoutingShared shared;
  CacheRoutingCounters counters;
  cache::PrefixTree tree;
  shared.prefix_tree = &tree;
  const auto topology = cache_aware_topology();
  const auto first = parse(R"({"messages":[{"role":"system","content":"You are terse."}]})");
  auto routing = lookup_cache(first, "", topology, shared);
  ASSERT_TRUE(routing.has_value());
  EXPECT_EQ(routing->hits.source, CacheHits::Source::kPrefixTree);
  EXPECT_TRUE(routing->hits.nodes.empty());
  record_routing(*routing, Pair{instance(kPrefillA, proto::Role::kPrefill), instance(kDecode, proto::Role::kDecode)},
                 shared, counters);
  const auto& c = counters;
  EXPECT_EQ(c.requests[0][1].load(), 1u);
  EXPECT_EQ(c.hits[0][1].load(), 0u);

  // The next turn extends the messages array: both nodes of the first turn hold its prefix.
  const auto next =
      parse(R"({"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"}]})");
  routing = lookup_cache(next, "", topology, shared);
  ASSERT_TRUE(routing.has_value());
  const uint32_t shared_prefix = static_cast<uint32_t>(std::string_view(R"([{"role":"system","content":"You are terse."})").size());
  EXPECT_EQ(routing->hits.prompt_units, routing->tree_key.size());
  EXPECT_EQ(routing->hits.matched(kPrefillA), shared_prefix);
  EXPECT_EQ(routing->hits.matched(kDecode), shared_prefix);
  EXPECT_EQ(routing->hits.matched(kPrefillB), 0u);
  record_routing(*routing, Pair{instance(kPrefillA, proto::Role::kPrefill), instance(kDecode, proto::Role::kDecode)},
                 shared, counters);
  EXPECT_EQ(c.requests[0][1].load(), 2u);
  EXPECT_EQ(c.hits[0][1].load(), 1u);
  EXPECT_EQ(c.hits[1][1].load(), 1u);
  EXPECT_EQ(c.matched_units[0][1].load(), shared_prefix);
}

TEST(CacheRouting, TokenIdsNobodyHoldsFallBackToThePrefixTree) {
  RoutingShared shared;
  cache::BlockIndex index;
  cache::PrefixTree tree;
  shared.block_index = &index;
  shared.prefix_tree = &tree;
  const auto body = parse(token_prompt(8));
  auto routing = lookup_cache(body, "m", cache_aware_topology(), shared);
  ASSERT_TRUE(routing.has_value());
  EXPECT_EQ(routing->hits.source, CacheHits::Source::kPrefixTree);
  EXPECT_EQ(routing->tree_key, "[0,1,2,3,4,5,6,7]");
}

// A prompt's blocks reach the KV events only once its prefill computed them: until then the next
// request sharing it learns from the prefix tree where it went, in token ids.
TEST(CacheRouting, TokenIdsJustRoutedCountWhereTheyWentBeforeTheirKvEvents) {
  RoutingShared shared;
  CacheRoutingCounters counters;
  cache::BlockIndex index;
  cache::PrefixTree tree;
  shared.block_index = &index;
  shared.prefix_tree = &tree;
  store(index, kPrefillA, 2);  // A computed tokens [0, 8) long ago
  const auto first_body = parse(token_prompt(22));  // the routing's tree key points into it
  const auto first = lookup_cache(first_body, "m", cache_aware_topology(), shared);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->hits.matched(kPrefillA), 8u);
  EXPECT_EQ(first->hits.matched(kPrefillB), 0u);
  record_routing(*first, Pair{instance(kPrefillB, proto::Role::kPrefill), instance(kDecode, proto::Role::kDecode)},
                 shared, counters);
  // The next turn extends it: B and the decode were sent its first 22 tokens (the last one's
  // comma is not in the shared text, so 21 count); A's events still say 8.
  const auto next = lookup_cache(parse(token_prompt(30)), "m", cache_aware_topology(), shared);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->hits.source, CacheHits::Source::kKvEvents);
  EXPECT_EQ(next->hits.prompt_units, 30u);
  EXPECT_EQ(next->hits.matched(kPrefillA), 8u);
  EXPECT_EQ(next->hits.matched(kPrefillB), 21u);
  EXPECT_EQ(next->hits.matched(kDecode), 21u);
  // Once the events show more than the tree knows, the events' figure stands.
  store(index, kPrefillB, 7);
  const auto later = lookup_cache(parse(token_prompt(30)), "m", cache_aware_topology(), shared);
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->hits.matched(kPrefillB), 28u);
}

TEST(CacheRouting, TheTreeKeyIsCappedAtThePromptBudget) {
  RoutingShared shared;
  auto topology = cache_aware_topology();
  topology.policies.cache_aware.prefix_tree_prompt_bytes = 64;
  const auto body = parse("{\"prompt\":\"" + std::string(500, 'x') + "\"}");
  auto routing = lookup_cache(body, "", topology, shared);
  ASSERT_TRUE(routing.has_value());
  EXPECT_EQ(routing->tree_key.size(), 64u);
  EXPECT_EQ(routing->hits.prompt_units, 64u);
}

// policies.cache_aware.tokenize: node: a text prompt's ids from a node replace the prefix tree's
// answer only when some node holds their first block; the tree key stays for record_routing.
TEST(CacheRouting, TokenizedTextMatchesExactlyOrKeepsThePrefixTree) {
  RoutingShared shared;
  cache::BlockIndex index;
  cache::PrefixTree tree;
  shared.block_index = &index;
  shared.prefix_tree = &tree;
  store(index, kPrefillB, 3);
  const auto body = parse(R"({"model":"m","prompt":"some text"})");
  const auto t = cache_aware_topology();
  auto routing = lookup_cache(body, "m", t, shared);
  ASSERT_TRUE(routing.has_value());
  EXPECT_EQ(routing->hits.source, CacheHits::Source::kPrefixTree);
  const std::string_view key = routing->tree_key;
  EXPECT_FALSE(match_token_ids({100, 101, 102, 103}, "m", shared, &*routing));  // nobody holds it
  EXPECT_EQ(routing->hits.source, CacheHits::Source::kPrefixTree);
  EXPECT_FALSE(match_token_ids({}, "m", shared, &*routing));
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 14; ++i) tokens.push_back(i);  // 3 blocks of 4 held, 2 tokens more
  ASSERT_TRUE(match_token_ids(tokens, "m", shared, &*routing));
  EXPECT_EQ(routing->hits.source, CacheHits::Source::kKvEvents);
  EXPECT_EQ(routing->hits.prompt_units, 14u);
  EXPECT_EQ(routing->hits.matched(kPrefillB), 12u);
  EXPECT_EQ(routing->hits.matched(kPrefillA), 0u);
  EXPECT_EQ(routing->tree_key, key);
  RoutingShared no_index;
  EXPECT_FALSE(match_token_ids(tokens, "m", no_index, &*routing));  // kv_events off
}

}  // namespace
TEST(CacheRouting, NodesThatLeftOrRestartedAreForgottenByThePrefixTree) {
  cache::PrefixTree tree;
  const auto now = cache::PrefixTree::Clock::now();
  for (const char* node : {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"}) {
    tree.insert("the same long system prompt", node, now);
  }
  auto node = [](const char* key, uint64_t epoch, uint64_t restarts = 0) {
    InstancePtr i = instance(key, proto::Role::kPrefill);
    auto* mutable_i = const_cast<discovery::Instance*>(i.get());
    mutable_i->epoch = epoch;
    mutable_i->restarts = restarts;
    return i;
  };
  const std::vector<InstancePtr> before = {node("127.0.0.1:1", 7), node("127.0.0.1:2", 7), node("127.0.0.1:3", 7),
                                           node("127.0.0.1:4", 7, 1)};
  // :1 unchanged, :2 restarted (new epoch), :3 gone, :4 restarted (same epoch reported, counted).
  const std::vector<InstancePtr> after = {node("127.0.0.1:1", 7), node("127.0.0.1:2", 8), node("127.0.0.1:4", 7, 2),
                                          node("127.0.0.1:5", 1)};
  forget_departed_nodes(before, after, tree);
  std::vector<std::string> left;
  for (const auto& m : tree.match("the same long system prompt")) left.push_back(m.tenant);
  EXPECT_EQ(left, std::vector<std::string>{"127.0.0.1:1"});
}

}  // namespace pdr::router::routing

// ProxyShared::forget_departed_nodes (router/proxy/proxy_shared.h) over forget_departed_nodes above.
namespace pdr::router::proxy {
namespace {

// Every worker reports each registry snapshot it sees; each is diffed once, and a worker late to
// an older snapshot cannot forget a node that restarted and has been learnt again since.
TEST(CacheRouting, EachSnapshotsDeparturesAreForgottenOnce) {
  cache::PrefixTree tree;
  ProxyShared shared;
  shared.prefix_tree = &tree;
  auto snapshot = [](uint64_t version, std::vector<InstancePtr> instances) {
    auto s = std::make_shared<discovery::RegistrySnapshot>();
    s->version = version;
    s->instances = std::move(instances);
    return std::shared_ptr<const discovery::RegistrySnapshot>(s);
  };
  auto node = [](const char* key, uint64_t epoch) {
    auto i = std::make_shared<discovery::Instance>();
    i->key = key;
    i->epoch = epoch;
    return InstancePtr(i);
  };
  const auto now = cache::PrefixTree::Clock::now();
  const auto v1 = snapshot(1, {node("127.0.0.1:1", 1), node("127.0.0.1:2", 1)});
  const auto v2 = snapshot(2, {node("127.0.0.1:1", 1)});                         // :2 left
  const auto v3 = snapshot(3, {node("127.0.0.1:1", 1), node("127.0.0.1:2", 2)});  // :2 is back, restarted
  tree.insert("prompt", "127.0.0.1:1", now);
  tree.insert("prompt", "127.0.0.1:2", now);
  shared.forget_departed_nodes(v1);  // worker 0
  shared.forget_departed_nodes(v1);  // worker 1
  shared.forget_departed_nodes(v2);  // worker 0
  EXPECT_EQ(tree.match("prompt").size(), 1u);
  shared.forget_departed_nodes(v3);  // worker 0
  tree.insert("prompt", "127.0.0.1:2", now);  // routed to the restarted node: learnt again
  shared.forget_departed_nodes(v2);  // worker 1, late: v3 was handled already
  shared.forget_departed_nodes(v3);
  EXPECT_EQ(tree.match("prompt").size(), 2u);
}

// A request waiting for a node predicted within its SLO re-checks when the registry changes (a
// node joined or came back), once per snapshot, not only when a leg ends somewhere.
TEST(CacheRouting, ANewRegistrySnapshotWakesTheSloWaitersOnce) {
  ProxyShared shared;  // no prefix tree: the wake does not depend on one
  auto snapshot = [](uint64_t version) {
    auto s = std::make_shared<discovery::RegistrySnapshot>();
    s->version = version;
    return std::shared_ptr<const discovery::RegistrySnapshot>(s);
  };
  int rechecks = 0;
  const auto v1 = snapshot(1), v2 = snapshot(2);
  shared.forget_departed_nodes(v1);  // the first snapshot a worker sees: nothing changed yet
  shared.slo_gate.park(0, [&rechecks] { ++rechecks; });
  shared.forget_departed_nodes(v1);  // another worker, the same snapshot
  EXPECT_EQ(rechecks, 0);
  shared.forget_departed_nodes(v2);  // without a post, the gate runs re-checks on this thread
  EXPECT_EQ(rechecks, 1);
  shared.forget_departed_nodes(v2);
  EXPECT_EQ(rechecks, 1);
}

}  // namespace
}  // namespace pdr::router::proxy
