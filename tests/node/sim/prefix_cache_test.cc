#include "node/sim/prefix_cache.h"

#include <numeric>

#include <gtest/gtest.h>

namespace pdr::node::sim {
namespace {

std::vector<uint32_t> tokens(uint32_t count, uint32_t first = 1000) {
  std::vector<uint32_t> out(count);
  std::iota(out.begin(), out.end(), first);
  return out;
}

std::vector<uint64_t> removed(const PrefixCacheUpdate& u) {
  std::vector<uint64_t> out;
  for (const auto& c : u.changes) {
    if (!c.stored) out.insert(out.end(), c.hashes.begin(), c.hashes.end());
  }
  return out;
}

size_t stored_blocks(const PrefixCacheUpdate& u) {
  size_t n = 0;
  for (const auto& c : u.changes) n += c.stored ? c.hashes.size() : 0;
  return n;
}

TEST(SimPrefixCache, SecondIdenticalPromptHitsAllButItsLastBlock) {
  SimPrefixCache cache(4, 100);
  const auto prompt = tokens(12);  // 3 full blocks
  PrefixCacheUpdate first = cache.process(prompt);
  EXPECT_EQ(first.queried_tokens, 12u);
  EXPECT_EQ(first.cached_tokens, 0u);
  EXPECT_EQ(stored_blocks(first), 3u);
  // vLLM always computes the last token: of 12 tokens, at most (12 - 1) / 4 = 2 blocks hit.
  PrefixCacheUpdate second = cache.process(prompt);
  EXPECT_EQ(second.cached_tokens, 8u);
  EXPECT_TRUE(second.changes.empty());
  // One more token: all 3 blocks can hit, and the partial block is never stored.
  auto longer = prompt;
  longer.push_back(7);
  PrefixCacheUpdate third = cache.process(longer);
  EXPECT_EQ(third.cached_tokens, 12u);
  EXPECT_TRUE(third.changes.empty());
  const PrefixCacheStats s = cache.stats();
  EXPECT_EQ(s.queries, 3u);
  EXPECT_EQ(s.queried_tokens, 12u + 12u + 13u);
  EXPECT_EQ(s.hit_tokens, 20u);
  EXPECT_EQ(s.blocks, 3u);
}

TEST(SimPrefixCache, SharedPrefixHitsUpToTheFirstDifferentBlock) {
  SimPrefixCache cache(4, 100);
  auto a = tokens(16);
  cache.process(a);
  auto b = a;
  b[9] = 5;  // third block differs: blocks 0 and 1 hit
  PrefixCacheUpdate u = cache.process(b);
  EXPECT_EQ(u.cached_tokens, 8u);
  ASSERT_EQ(u.changes.size(), 1u);
  const PrefixCacheChange& run = u.changes[0];
  EXPECT_TRUE(run.stored);
  ASSERT_EQ(run.hashes.size(), 2u);  // blocks 2 and 3 of b are new
  ASSERT_TRUE(run.parent.has_value());
  // The parent is a's (and b's) second block: the chain runs through the shared prefix.
  const uint64_t h0 = SimPrefixCache::block_hash(std::nullopt, a.data(), 4);
  const uint64_t h1 = SimPrefixCache::block_hash(h0, a.data() + 4, 4);
  EXPECT_EQ(*run.parent, h1);
  EXPECT_EQ(run.hashes[0], SimPrefixCache::block_hash(h1, b.data() + 8, 4));
  EXPECT_EQ(run.tokens, std::vector<uint32_t>(b.begin() + 8, b.end()));
}

TEST(SimPrefixCache, HashesAreChainedNotPerBlock) {
  // Equal block contents after different prefixes are different blocks.
  std::vector<uint32_t> x = {1, 2, 3, 4, 9, 9, 9, 9};
  std::vector<uint32_t> y = {5, 6, 7, 8, 9, 9, 9, 9};
  SimPrefixCache cache(4, 100);
  cache.process(x);
  std::vector<uint32_t> y_plus = y;
  y_plus.push_back(0);
  EXPECT_EQ(cache.process(y_plus).cached_tokens, 0u);
  const uint64_t hx = SimPrefixCache::block_hash(std::nullopt, x.data(), 4);
  const uint64_t hy = SimPrefixCache::block_hash(std::nullopt, y.data(), 4);
  EXPECT_NE(SimPrefixCache::block_hash(hx, x.data() + 4, 4),
            SimPrefixCache::block_hash(hy, y.data() + 4, 4));
  // Deterministic: same inputs, same hash (other nodes and runs agree).
  EXPECT_EQ(hx, SimPrefixCache::block_hash(std::nullopt, x.data(), 4));
}

TEST(SimPrefixCache, EvictsLeastRecentlyUsedChainFromItsTail) {
  SimPrefixCache cache(2, 4);
  const auto a = tokens(4, 100);  // blocks a0 a1
  const auto b = tokens(4, 200);  // blocks b0 b1
  const auto c = tokens(4, 300);
  cache.process(a);
  cache.process(b);
  cache.process(a);  // a becomes most recently used
  PrefixCacheUpdate u = cache.process(c);  // needs 2 blocks: b's go, tail first
  const uint64_t b0 = SimPrefixCache::block_hash(std::nullopt, b.data(), 2);
  const uint64_t b1 = SimPrefixCache::block_hash(b0, b.data() + 2, 2);
  EXPECT_EQ(removed(u), (std::vector<uint64_t>{b1, b0}));
  ASSERT_EQ(u.changes.size(), 4u);  // removed b1, stored c0, removed b0, stored c1
  EXPECT_EQ(u.changes[3].parent, u.changes[1].hashes[0]);
  auto a_plus = a;
  a_plus.push_back(1);
  EXPECT_EQ(cache.process(a_plus).cached_tokens, 4u);
  auto b_plus = b;
  b_plus.push_back(1);
  EXPECT_EQ(cache.process(b_plus, /*store=*/false).cached_tokens, 0u);
  EXPECT_EQ(cache.stats().evicted_blocks, 2u);
  EXPECT_EQ(cache.stats().blocks, 4u);
}

TEST(SimPrefixCache, ChangesAreInOrderWhenAPromptOutgrowsTheCache) {
  SimPrefixCache cache(1, 2);
  PrefixCacheUpdate u = cache.process(tokens(3));  // stores t0 t1, evicts t0, stores t2
  ASSERT_EQ(u.changes.size(), 3u);
  EXPECT_TRUE(u.changes[0].stored);
  EXPECT_EQ(u.changes[0].hashes.size(), 2u);
  EXPECT_FALSE(u.changes[1].stored);
  EXPECT_EQ(u.changes[1].hashes, std::vector<uint64_t>{u.changes[0].hashes[0]});
  EXPECT_TRUE(u.changes[2].stored);
  EXPECT_EQ(u.changes[2].parent, u.changes[0].hashes[1]);
  EXPECT_EQ(cache.stats().blocks, 2u);
}

TEST(SimPrefixCache, LookupOnlyChangesNothingAndClearEmpties) {
  SimPrefixCache cache(4, 10);
  EXPECT_TRUE(cache.process(tokens(8), /*store=*/false).changes.empty());
  EXPECT_EQ(cache.stats().blocks, 0u);
  cache.process(tokens(8));
  EXPECT_EQ(cache.clear(), 2u);
  EXPECT_EQ(cache.process(tokens(9)).cached_tokens, 0u);
  EXPECT_EQ(cache.stats().clears, 1u);
}

TEST(SimPrefixCache, UncachedTokensShrinkAsTheCacheWarms) {
  // The sim's prefill time is prefill_us_per_token x (queried - cached): a conversation's turns
  // each pay for their new tokens only.
  SimPrefixCache cache(16, 1000);
  std::vector<uint32_t> conversation;
  for (uint32_t turn = 0; turn < 5; ++turn) {
    const auto added = tokens(64, 1000 + 64 * turn);
    conversation.insert(conversation.end(), added.begin(), added.end());
    const PrefixCacheUpdate u = cache.process(conversation);
    EXPECT_EQ(u.queried_tokens - u.cached_tokens, 64u) << turn;
  }
}

}  // namespace
}  // namespace pdr::node::sim
