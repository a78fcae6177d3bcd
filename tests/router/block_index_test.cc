#include "router/cache/block_index.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace pdr::router::cache {
namespace {

using proto::KvEvent;
using proto::KvEventBatch;
using proto::KvEventKind;

constexpr uint32_t kBlock = 4;

std::vector<uint32_t> tokens(uint32_t first, uint32_t count) {
  std::vector<uint32_t> t(count);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A BlockStored for blocks `engine_hashes` holding `toks` (kBlock tokens each).
KvEvent stored(std::vector<proto::EngineHash> engine_hashes, std::vector<uint32_t> toks,
               std::optional<proto::EngineHash> parent = std::nullopt) {
  KvEvent e;
  e.kind = KvEventKind::kBlockStored;
  e.block_hashes = std::move(engine_hashes);
  e.token_ids = std::move(toks);
  e.block_size = kBlock;
  e.parent_block_hash = parent;
  e.medium = "GPU";
  return e;
}

KvEvent removed(std::vector<proto::EngineHash> engine_hashes) {
  KvEvent e;
  e.kind = KvEventKind::kBlockRemoved;
  e.block_hashes = std::move(engine_hashes);
  return e;
}

KvEventBatch batch(std::vector<KvEvent> events) {
  KvEventBatch b;
  b.events = std::move(events);
  return b;
}

uint32_t matched(const BlockIndex& index, std::string_view node, const std::vector<uint32_t>& request) {
  for (const PrefixMatch& m : index.longest_prefix(request)) {
    if (m.node == node) return m.matched_blocks;
  }
  return 0;
}

TEST(ChainHashes, FullBlocksOnlyChainedAndSeededByLora) {
  const auto t = tokens(10, 10);
  const auto h = chain_hashes(t, kBlock);
  ASSERT_EQ(h.size(), 2u);  // the trailing 2 tokens are no block
  EXPECT_EQ(h, chain_hashes(tokens(10, 8), kBlock));
  // Chained: the second block's hash depends on the first block's tokens.
  auto other = t;
  other[0] = 999;
  EXPECT_NE(chain_hashes(other, kBlock)[1], h[1]);
  EXPECT_NE(chain_hashes(t, kBlock, "adapter-a")[0], h[0]);
  EXPECT_TRUE(chain_hashes(t, 0).empty());
}

TEST(BlockIndex, StoredBlocksAnswerTheLongestPrefixPerNode) {
  BlockIndex index;
  index.apply("127.0.0.1:8100", 0, batch({stored({101, 102, 103}, tokens(0, 12))}));
  index.apply("127.0.0.1:8200", 0, batch({stored({201}, tokens(0, 4))}));
  const auto request = tokens(0, 14);  // 3 full blocks + 2 tokens
  const auto matches = index.longest_prefix(request);
  ASSERT_EQ(matches.size(), 2u);
  EXPECT_EQ(matches[0].node, "127.0.0.1:8100");
  EXPECT_EQ(matches[0].matched_blocks, 3u);
  EXPECT_EQ(matches[0].block_size, kBlock);
  EXPECT_EQ(matches[1].node, "127.0.0.1:8200");
  EXPECT_EQ(matches[1].matched_blocks, 1u);
  // A request that diverges in block 1 matches one block on both.
  auto diverging = tokens(0, 12);
  diverging[5] = 777;
  EXPECT_EQ(matched(index, "127.0.0.1:8100", diverging), 1u);
  // Another first block: nothing.
  EXPECT_TRUE(index.longest_prefix(tokens(50, 12)).empty());
  EXPECT_EQ(index.stats().entries, 4u);
}

TEST(BlockIndex, LaterEventsChainThroughTheParentEngineHash) {
  BlockIndex index;
  index.apply("n1", 0, batch({stored({1}, tokens(0, 4))}));
  index.apply("n1", 0, batch({stored({2, 3}, tokens(4, 8), /*parent=*/1)}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 12)), 3u);
  // A parent this index never saw (stored before we subscribed): not indexed, counted.
  index.apply("n1", 0, batch({stored({9}, tokens(100, 4), /*parent=*/12345)}));
  EXPECT_EQ(index.node_stats("n1").blocks_skipped, 1u);
  EXPECT_EQ(index.node_stats("n1").entries, 3u);
}

TEST(BlockIndex, RemovalsAndClearsShortenOrEmptyTheMatch) {
  BlockIndex index;
  index.apply("n1", 0, batch({stored({1, 2, 3}, tokens(0, 12))}));
  index.apply("n1", 0, batch({removed({2})}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 12)), 1u);  // block 2 of the chain is gone
  index.apply("n1", 0, batch({removed({777})}));        // unknown: ignored
  KvEvent clear;
  clear.kind = KvEventKind::kAllBlocksCleared;
  index.apply("n1", 0, batch({clear}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 12)), 0u);
  EXPECT_EQ(index.stats().entries, 0u);
  EXPECT_EQ(index.node_stats("n1").blocks_removed, 3u);
}

TEST(BlockIndex, EachDpRankKeepsItsOwnCopy) {
  BlockIndex index;
  index.apply("n1", 0, batch({stored({1, 2}, tokens(0, 8))}));
  index.apply("n1", 1, batch({stored({1, 2}, tokens(0, 8))}));
  index.apply("n1", 0, batch({removed({1, 2})}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 8)), 2u);  // rank 1 still holds both
  EXPECT_EQ(index.node_stats("n1").entries, 2u);
}

TEST(BlockIndex, DroppingANodeForgetsOnlyIt) {
  BlockIndex index;
  index.apply("n1", 0, batch({stored({1, 2}, tokens(0, 8))}));
  index.apply("n1", 1, batch({stored({1}, tokens(0, 4))}));
  index.apply("n2", 0, batch({stored({1}, tokens(0, 4))}));
  index.drop_node("n1");
  EXPECT_EQ(matched(index, "n1", tokens(0, 8)), 0u);
  EXPECT_EQ(matched(index, "n2", tokens(0, 8)), 1u);
  EXPECT_EQ(index.stats().entries, 1u);
  // The node may come back (a restart): it starts empty and indexes again.
  index.apply("n1", 0, batch({stored({5}, tokens(0, 4))}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 8)), 1u);
}

// Nodes that come and go (pod churn, restarts, gaps without replay) reuse the slots of those
// that left: the index's bookkeeping is bounded by the nodes live at once, not by churn. A reused
// slot inherits nothing: the budget's old records for it are stale and evict nothing of the new
// holder's.
TEST(BlockIndex, SlotsOfDroppedNodesAreReusedWithoutInheritingTheirRecords) {
  BlockIndex index(/*max_entries=*/3);
  for (int i = 0; i < 1000; ++i) {
    const std::string node = "churn-" + std::to_string(i);
    index.apply(node, 0, batch({stored({1, 2}, tokens(0, 8))}));
    index.drop_node(node);
  }
  EXPECT_EQ(index.holder_slots(), 1u);  // one slot passed from node to node
  EXPECT_EQ(index.stats().entries, 0u);
  // The slot goes to "fresh" while the budget's records of the slot's earlier holders (engine
  // hashes 1 and 2) are still queued ahead of everything stored from here on.
  index.apply("fresh", 0, batch({stored({7}, tokens(200, 4))}));
  index.apply("keep", 0, batch({stored({9}, tokens(100, 4))}));
  index.apply("fresh", 0, batch({stored({1}, tokens(0, 4))}));
  EXPECT_EQ(index.holder_slots(), 2u);
  EXPECT_EQ(index.stats().entries, 3u);
  // Over budget by one: the least recently stored live entry (fresh's block 7) goes. A stale
  // record taken for a live one would have evicted fresh's block 1, stored last.
  index.apply("keep", 0, batch({stored({10}, tokens(104, 4), /*parent=*/9)}));
  EXPECT_EQ(index.stats().entries, 3u);
  EXPECT_EQ(index.stats().blocks_evicted, 1u);
  EXPECT_EQ(matched(index, "fresh", tokens(200, 4)), 0u);
  EXPECT_EQ(matched(index, "fresh", tokens(0, 4)), 1u);
  EXPECT_EQ(matched(index, "keep", tokens(100, 8)), 2u);
}

TEST(BlockIndex, DroppingARankKeepsTheNodesOtherRanks) {
  BlockIndex index;
  index.apply("n1", 0, batch({stored({1, 2}, tokens(0, 8))}));
  index.apply("n1", 1, batch({stored({1}, tokens(100, 4))}));
  index.drop_rank("n1", 1);
  EXPECT_EQ(matched(index, "n1", tokens(0, 8)), 2u);
  EXPECT_EQ(matched(index, "n1", tokens(100, 4)), 0u);
  EXPECT_EQ(index.node_stats("n1").entries, 2u);
  index.drop_rank("n1", 7);  // a rank never seen: nothing happens
  EXPECT_EQ(index.stats().entries, 2u);
}

TEST(BlockIndex, ExtraKeysAndBadTokenCountsAreNotIndexed) {
  BlockIndex index;
  KvEvent image = stored({1}, tokens(0, 4));
  image.has_extra_keys = true;  // an image's placeholder tokens do not identify the image
  KvEvent short_tokens = stored({2, 3}, tokens(0, 5));
  index.apply("n1", 0, batch({image, short_tokens}));
  EXPECT_EQ(index.stats().entries, 0u);
  EXPECT_EQ(index.stats().blocks_skipped, 3u);
  EXPECT_TRUE(index.longest_prefix(tokens(0, 8)).empty());
}

TEST(BlockIndex, LoraBlocksMatchOnlyRequestsForThatLora) {
  BlockIndex index;
  KvEvent e = stored({1}, tokens(0, 4));
  e.lora_name = "adapter-a";
  index.apply("n1", 0, batch({e}));
  EXPECT_TRUE(index.longest_prefix(tokens(0, 4)).empty());
  ASSERT_EQ(index.longest_prefix(tokens(0, 4), "adapter-a").size(), 1u);
}

TEST(BlockIndex, TheBudgetDropsTheLeastRecentlyStored) {
  BlockIndex index(/*max_entries=*/4);
  index.apply("n1", 0, batch({stored({1, 2, 3}, tokens(0, 12))}));
  index.apply("n2", 0, batch({stored({11, 12, 13}, tokens(0, 12))}));
  EXPECT_EQ(index.stats().entries, 4u);
  EXPECT_EQ(index.stats().blocks_evicted, 2u);
  // n1's first two blocks went first: its chain now starts missing.
  EXPECT_EQ(matched(index, "n1", tokens(0, 12)), 0u);
  EXPECT_EQ(matched(index, "n2", tokens(0, 12)), 3u);
  // Churn of store/remove leaves the budget exact (each store evicts once over it: n1's last
  // block goes at the first) and the order right.
  for (int i = 0; i < 5000; ++i) {
    index.apply("n3", 0, batch({stored({100}, tokens(1000, 4))}));
    index.apply("n3", 0, batch({removed({100})}));
  }
  EXPECT_EQ(index.stats().entries, 3u);  // n2's three blocks
  EXPECT_EQ(index.stats().blocks_evicted, 3u);
  // Re-storing makes a block the most recent: the next evictions take n2's other blocks first.
  index.apply("n2", 0, batch({stored({11}, tokens(0, 4))}));
  index.apply("n4", 0, batch({stored({21, 22}, tokens(50, 8))}));
  EXPECT_EQ(index.stats().entries, 4u);
  EXPECT_EQ(matched(index, "n2", tokens(0, 12)), 1u);  // block 0 kept, block 1 (12) evicted
  EXPECT_EQ(matched(index, "n4", tokens(50, 8)), 2u);
}

}  // namespace
}  // namespace pdr::router::cache
