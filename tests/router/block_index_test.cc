#include "router/cache/block_index.h"

#include <gtest/gtest.h>

#include <msgpack.hpp>

#include <numeric>
#include <span>
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

TEST(BlockIndex, BadTokenAndExtraKeyCountsAreNotIndexed) {
  BlockIndex index;
  KvEvent short_tokens = stored({2, 3}, tokens(0, 5));
  KvEvent short_extra = stored({4, 5}, tokens(0, 8));
  short_extra.extra_keys = {proto::kv_extra_keys_for_cache_salt("s")};  // one entry for two blocks
  index.apply("n1", 0, batch({short_tokens, short_extra}));
  EXPECT_EQ(index.stats().entries, 0u);
  EXPECT_EQ(index.stats().blocks_skipped, 4u);
  EXPECT_TRUE(index.longest_prefix(tokens(0, 8)).empty());
}

// A block whose extra keys differ is a different block, and so is every block chained after it;
// the blocks before it hold plain tokens and match a plain request. A token-id request has no
// multimodal identifiers: it never matches their blocks.
TEST(BlockIndex, ExtraKeysMakeADifferentBlock) {
  BlockIndex index;
  KvEvent image = stored({1, 2, 3}, tokens(0, 12));
  image.extra_keys = {"", proto::kv_extra_keys_for_cache_salt("mm-hash-a"), ""};  // block 1 shows an image
  index.apply("with-image", 0, batch({image}));
  index.apply("plain", 0, batch({stored({1, 2, 3}, tokens(0, 12))}));
  EXPECT_EQ(matched(index, "plain", tokens(0, 12)), 3u);
  EXPECT_EQ(matched(index, "with-image", tokens(0, 12)), 1u);  // block 0 only
  EXPECT_EQ(index.stats().entries, 6u);  // all indexed, under their own keys
  // Another image at the same place: another block.
  KvEvent other = image;
  other.extra_keys[1] = proto::kv_extra_keys_for_cache_salt("mm-hash-b");
  index.apply("other-image", 0, batch({other}));
  EXPECT_EQ(chain_hashes(tokens(0, 12), kBlock).size(), 3u);
  EXPECT_EQ(matched(index, "other-image", tokens(0, 12)), 1u);
}

// vLLM hashes a request's cache_salt into its first block: salted blocks match only requests with
// the same salt, and a salted request matches no unsalted block.
TEST(BlockIndex, CacheSaltIsTheFirstBlocksExtraKey) {
  BlockIndex index;
  const std::string salt_a = proto::kv_extra_keys_for_cache_salt("tenant-a");
  KvEvent salted = stored({1, 2}, tokens(0, 8));
  salted.extra_keys = {salt_a, ""};
  index.apply("salted", 0, batch({salted}));
  index.apply("plain", 0, batch({stored({1, 2}, tokens(0, 8))}));
  const auto holders = [&](std::string_view extra) {
    std::vector<std::pair<std::string, uint32_t>> out;
    for (const PrefixMatch& m : index.longest_prefix(tokens(0, 8), std::nullopt, extra)) {
      out.emplace_back(m.node, m.matched_blocks);
    }
    return out;
  };
  EXPECT_EQ(holders(""), (std::vector<std::pair<std::string, uint32_t>>{{"plain", 2}}));
  EXPECT_EQ(holders(salt_a), (std::vector<std::pair<std::string, uint32_t>>{{"salted", 2}}));
  EXPECT_TRUE(holders(proto::kv_extra_keys_for_cache_salt("tenant-b")).empty());
  EXPECT_EQ(chain_hashes(tokens(0, 8), kBlock, std::nullopt, salt_a).size(), 2u);
  EXPECT_NE(chain_hashes(tokens(0, 8), kBlock, std::nullopt, salt_a)[1], chain_hashes(tokens(0, 8), kBlock)[1]);
}

TEST(BlockIndex, LoraBlocksMatchOnlyRequestsForThatLora) {
  BlockIndex index;
  KvEvent e = stored({1}, tokens(0, 4));
  e.lora_name = "adapter-a";
  e.lora_id = 1;
  index.apply("n1", 0, batch({e}));
  index.apply("n2", 0, batch({stored({1}, tokens(0, 4))}));
  const auto base = index.longest_prefix(tokens(0, 4));
  ASSERT_EQ(base.size(), 1u);
  EXPECT_EQ(base[0].node, "n2");
  const auto adapter = index.longest_prefix(tokens(0, 4), "adapter-a");
  ASSERT_EQ(adapter.size(), 1u);
  EXPECT_EQ(adapter[0].node, "n1");
  EXPECT_TRUE(index.longest_prefix(tokens(0, 4), "adapter-b").empty());
  EXPECT_TRUE(index.knows_lora("adapter-a"));
  EXPECT_FALSE(index.knows_lora("adapter-b"));
  EXPECT_FALSE(index.knows_lora("n2"));
}

// Older vLLM named the adapter by lora_id alone: no request names an adapter so, and its blocks
// are not the base model's. Not indexed (before, they were indexed as the base model's).
TEST(BlockIndex, AnAdapterNamedOnlyByIdIsNotIndexed) {
  BlockIndex index;
  KvEvent e = stored({1, 2}, tokens(0, 8));
  e.lora_id = 3;
  index.apply("n1", 0, batch({e}));
  EXPECT_TRUE(index.longest_prefix(tokens(0, 8)).empty());
  EXPECT_EQ(index.stats().blocks_skipped, 2u);
  EXPECT_EQ(index.stats().entries, 0u);
}

KvEvent in_group(KvEvent e, int64_t group, std::optional<std::string> kind,
                 std::optional<int64_t> window = std::nullopt) {
  e.group_idx = group;
  e.kv_cache_spec_kind = std::move(kind);
  e.kv_cache_spec_sliding_window = window;
  return e;
}

// Hybrid models publish one group per attention type: only full attention holds the prefix.
TEST(BlockIndex, OnlyFullAttentionGroupsArePrefixHits) {
  BlockIndex index;
  index.apply("sliding", 0, batch({in_group(stored({1, 2, 3}, tokens(0, 12)), 1, "sliding_window", 8)}));
  index.apply("mamba", 0, batch({in_group(stored({1, 2, 3}, tokens(0, 12)), 2, "mamba")}));
  index.apply("chunked", 0, batch({in_group(stored({1, 2, 3}, tokens(0, 12)), 3, "chunked_local_attention")}));
  index.apply("unknown", 0, batch({in_group(stored({1, 2, 3}, tokens(0, 12)), 4, "unknown")}));
  // Older vLLM: no kind, but a window.
  index.apply("windowed", 0, batch({in_group(stored({1, 2, 3}, tokens(0, 12)), 1, std::nullopt, 4096)}));
  index.apply("full", 0, batch({in_group(stored({1, 2, 3}, tokens(0, 12)), 0, "full_attention")}));
  index.apply("mla", 0, batch({in_group(stored({1, 2}, tokens(0, 8)), 0, "mla_attention")}));
  const auto matches = index.longest_prefix(tokens(0, 12));
  ASSERT_EQ(matches.size(), 2u);
  EXPECT_EQ(matches[0].node, "full");
  EXPECT_EQ(matches[0].matched_blocks, 3u);
  EXPECT_EQ(matches[1].node, "mla");
  EXPECT_EQ(index.stats().blocks_ignored, 15u);
  EXPECT_EQ(index.node_stats("mamba").blocks_ignored, 3u);
  EXPECT_EQ(index.stats().entries, 5u);
}

// Each group's blocks are held apart: a sliding-window group that slides past a block removes its
// own copy, not the full-attention group's (vLLM sends the same engine hash in both).
TEST(BlockIndex, RemovalsInOtherGroupsLeaveFullAttentionEntries) {
  BlockIndex index;
  index.apply("n1", 0,
              batch({in_group(stored({1, 2, 3}, tokens(0, 12)), 0, "full_attention"),
                     in_group(stored({1, 2, 3}, tokens(0, 12)), 1, "sliding_window", 4)}));
  KvEvent slid = removed({1, 2});
  slid.group_idx = 1;
  index.apply("n1", 0, batch({slid}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 12)), 3u);
  KvEvent evicted = removed({2});
  evicted.group_idx = 0;
  index.apply("n1", 0, batch({evicted}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 12)), 1u);
  // A store without a kind in a group already known as sliding window (an offload tier's
  // placeholder) stays out too.
  KvEvent placeholder = in_group(stored({7}, tokens(100, 4)), 1, std::nullopt);
  index.apply("n1", 0, batch({placeholder}));
  EXPECT_EQ(matched(index, "n1", tokens(100, 4)), 0u);
}

// vLLM needs a hit in every full-attention group: a rank holds a prefix as far as all its
// full-attention groups do.
TEST(BlockIndex, SeveralFullAttentionGroupsHoldAsFarAsTheShortest) {
  BlockIndex index;
  index.apply("n1", 0,
              batch({in_group(stored({1, 2, 3}, tokens(0, 12)), 0, "full_attention"),
                     in_group(stored({1, 2}, tokens(0, 8)), 2, "full_attention")}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 12)), 2u);
  KvEvent gone = removed({1});
  gone.group_idx = 2;
  index.apply("n1", 0, batch({gone}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 12)), 0u);
}

TEST(BlockIndex, GroupsPerRankAreCapped) {
  BlockIndex index;
  std::vector<KvEvent> events;
  for (int64_t g = 0; g <= static_cast<int64_t>(BlockIndex::kMaxGroupsPerRank); ++g) {
    events.push_back(in_group(stored({static_cast<uint64_t>(100 + g)}, tokens(0, 4)), g, "full_attention"));
  }
  index.apply("n1", 0, batch(events));
  EXPECT_EQ(index.stats().entries, BlockIndex::kMaxGroupsPerRank);
  EXPECT_EQ(index.stats().blocks_skipped, 1u);
}

KvEvent on(KvEvent e, std::string medium) {
  e.medium = std::move(medium);
  return e;
}

// A block held in the GPU and a CPU tier counts once, and leaves only when both removed it.
TEST(BlockIndex, TiersAreHeldApartAndCountedOnce) {
  BlockIndex index;
  index.apply("n1", 0, batch({on(stored({1, 2, 3}, tokens(0, 12)), "GPU"), on(stored({1, 2, 3}, tokens(0, 12)), "CPU")}));
  auto m = index.longest_prefix(tokens(0, 12));
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].matched_blocks, 3u);
  EXPECT_EQ(m[0].gpu_blocks, 3u);
  EXPECT_EQ(m[0].cached_tokens(), 12u);
  index.apply("n1", 0, batch({on(removed({2, 3}), "GPU")}));  // evicted from the GPU, kept on the CPU
  m = index.longest_prefix(tokens(0, 12));
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].matched_blocks, 3u);
  EXPECT_EQ(m[0].gpu_blocks, 1u);
  EXPECT_EQ(m[0].cached_tokens(), 4u + 8u * kOffloadWeightPercent / 100);
  index.apply("n1", 0, batch({on(removed({1, 2, 3}), "CPU")}));
  m = index.longest_prefix(tokens(0, 12));
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].matched_blocks, 1u);  // block 0 is still on the GPU
  EXPECT_EQ(m[0].gpu_blocks, 1u);
}

// The offloading connector may announce a block once per chunk holding it and removes it as
// often: a CPU-tier block stays until its last announcement is removed.
TEST(BlockIndex, CpuTierStoresAreReferenceCounted) {
  BlockIndex index;
  index.apply("n1", 0, batch({on(stored({1, 2}, tokens(0, 8)), "CPU"), on(stored({2}, tokens(4, 4), 1), "CPU")}));
  index.apply("n1", 0, batch({on(removed({2}), "CPU")}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 8)), 2u);
  index.apply("n1", 0, batch({on(removed({2}), "CPU")}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 8)), 1u);
}

// A tokenless CPU store (the connector's placeholder: engine keys, a tier, block_size 0) is named
// by the rank's GPU entry of the same engine hash; without one it cannot be indexed.
TEST(BlockIndex, TokenlessOffloadStoresAreNamedByTheirGpuTwin) {
  BlockIndex index;
  index.apply("n1", 0, batch({stored({1, 2, 3}, tokens(0, 12))}));
  KvEvent placeholder = on(stored({1, 2, 3, 99}, {}), "CPU");
  placeholder.block_size = 0;
  index.apply("n1", 0, batch({placeholder}));
  EXPECT_EQ(index.node_stats("n1").blocks_skipped, 1u);  // 99 has no GPU twin
  index.apply("n1", 0, batch({on(removed({1, 2, 3}), "GPU")}));
  auto m = index.longest_prefix(tokens(0, 12));
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].matched_blocks, 3u);
  EXPECT_EQ(m[0].gpu_blocks, 0u);
  // A later GPU store chains from a parent only the CPU tier still holds.
  index.apply("n1", 0, batch({stored({4}, tokens(12, 4), /*parent=*/3)}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 16)), 4u);
}

// Shared or remote tiers say nothing about which node to prefer: not indexed.
TEST(BlockIndex, StorageAndRemoteTiersAreIgnored) {
  BlockIndex index;
  KvEvent remote = on(stored({1}, tokens(0, 4)), "CPU");
  remote.locality = "REMOTE";
  index.apply("n1", 0, batch({on(stored({1}, tokens(0, 4)), "STORAGE"), remote}));
  EXPECT_TRUE(index.longest_prefix(tokens(0, 4)).empty());
  EXPECT_EQ(index.stats().blocks_ignored, 2u);
  KvEvent local = on(stored({1}, tokens(0, 4)), "cpu");
  local.locality = "local";
  index.apply("n1", 0, batch({local}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 4)), 1u);
}

// GPU-held tokens count in full, CPU-only ones at kOffloadWeightPercent.
TEST(BlockIndex, GpuHitsRankAboveEqualCpuHits) {
  BlockIndex index;
  index.apply("cpu-long", 0, batch({on(stored({1, 2, 3}, tokens(0, 12)), "CPU")}));
  index.apply("gpu", 0, batch({stored({1, 2}, tokens(0, 8))}));
  index.apply("cpu-short", 0, batch({on(stored({1, 2}, tokens(0, 8)), "CPU")}));
  const auto m = index.longest_prefix(tokens(0, 12));
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].node, "gpu");        // 8 tokens
  EXPECT_EQ(m[1].node, "cpu-long");   // 12 at half: 6
  EXPECT_EQ(m[2].node, "cpu-short");  // 8 at half: 4
}

TEST(BlockIndex, AClearEmptiesEveryGroupAndTierOfTheRank) {
  BlockIndex index;
  index.apply("n1", 0,
              batch({in_group(stored({1, 2}, tokens(0, 8)), 0, "full_attention"),
                     on(in_group(stored({1, 2}, tokens(0, 8)), 0, "full_attention"), "CPU"),
                     in_group(stored({1, 2}, tokens(0, 8)), 3, "full_attention")}));
  index.apply("n1", 1, batch({stored({1}, tokens(0, 4))}));
  KvEvent clear;
  clear.kind = KvEventKind::kAllBlocksCleared;
  index.apply("n1", 0, batch({clear}));
  EXPECT_EQ(index.stats().entries, 1u);  // rank 1's
  EXPECT_EQ(matched(index, "n1", tokens(0, 8)), 1u);
}

// A batch without events changes nothing: no holder, no counter.
TEST(BlockIndex, AnEmptyBatchChangesNothing) {
  BlockIndex index;
  index.apply("n1", 0, batch({}));
  EXPECT_EQ(index.holder_slots(), 0u);
  const auto s = index.node_stats("n1");
  EXPECT_EQ(s.entries + s.blocks_stored + s.blocks_skipped + s.blocks_ignored, 0u);
  index.apply("n1", 0, batch({stored({1}, tokens(0, 4))}));
  index.apply("n1", 0, batch({}));
  EXPECT_EQ(matched(index, "n1", tokens(0, 4)), 1u);
  EXPECT_EQ(index.holder_slots(), 1u);
}

// What vLLM >= 0.26 sends, through the decoder: an adapter's blocks carry the adapter's name in
// every block's extra keys, and are indexed under the adapter (they used to be skipped as
// blocks with extra keys).
TEST(BlockIndex, DecodedAdapterEventsAreIndexedUnderTheAdapter) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  const auto str = [&](std::string_view t) {
    p.pack_str(static_cast<uint32_t>(t.size()));
    p.pack_str_body(t.data(), static_cast<uint32_t>(t.size()));
  };
  p.pack_array(3);
  p.pack_double(1.0);
  p.pack_array(1);
  p.pack_map(11);
  str("type"), str("BlockStored");
  str("block_hashes"), p.pack_array(2), p.pack_uint64(1), p.pack_uint64(2);
  str("parent_block_hash"), p.pack_nil();
  str("token_ids"), p.pack_array(8);
  for (uint32_t t = 0; t < 8; ++t) p.pack_uint32(t);
  str("block_size"), p.pack_uint32(kBlock);
  str("lora_id"), p.pack_uint32(1);
  str("medium"), str("GPU");
  str("lora_name"), str("adapter-a");
  str("extra_keys"), p.pack_array(2), p.pack_array(1), str("adapter-a"), p.pack_array(1), str("adapter-a");
  str("group_idx"), p.pack_uint32(0);
  str("kv_cache_spec_kind"), str("full_attention");
  p.pack_uint32(0);
  KvEventBatch decoded;
  ASSERT_TRUE(
      proto::decode_kv_event_batch(std::as_bytes(std::span(buf.data(), buf.size())), proto::KvEventLimits{}, &decoded)
          .is_ok());
  BlockIndex index;
  index.apply("n1", 0, decoded);
  const auto m = index.longest_prefix(tokens(0, 8), "adapter-a");
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].matched_blocks, 2u);
  EXPECT_TRUE(index.longest_prefix(tokens(0, 8)).empty());
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
