// EngineBlockPool: the KV cache of one simulated vLLM engine (one DP rank of `pdnode sim --engine
// vllm`), kept the way vLLM V1's BlockPool keeps it (vllm/v1/core/block_pool.py and
// docs/design/prefix_caching.md), so that which blocks stay cached, which get evicted, and the KV
// events announcing both follow what a real engine would do.
//
// Blocks 1..num_blocks-1 hold KV; block 0 is vLLM's null block and never used. Each block has a
// reference count (the running requests holding it) and, once full of computed tokens, a hash (its
// prefix-cache name, chained over its parent's). Every block with no reference sits in one free
// queue, cached or not, in LRU order: the head is evicted first. allocate() pops blocks from the
// head and drops the hash of each (a BlockRemoved); release() appends blocks whose count reaches 0
// to the tail in the order given (a request's blocks are given last block first, so a finished
// prompt's tail is evicted before its head); touch() takes a cache hit's blocks out of the queue.
// Two blocks may carry the same hash (two requests computed the same prefix at once): lookups find
// either, and each one's eviction is its own BlockRemoved, as in vLLM.
//
// The events (BlockStored runs the caller records with note_stored(), BlockRemoved runs from
// evictions) accumulate in order until take_events().
//
// Pure and single-threaded: no I/O, no clocks, no locks.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "node/sim/prefix_cache.h"

namespace pdr::node::sim {

class EngineBlockPool {
 public:
  // num_blocks >= 2 (the null block and at least one more).
  explicit EngineBlockPool(uint32_t num_blocks);

  uint32_t num_blocks() const { return static_cast<uint32_t>(blocks_.size()); }
  // Blocks with no reference (the free queue's length), cached ones included.
  uint32_t free_blocks() const { return free_count_; }
  // vLLM's kv_cache_usage_perc: 1 - free / (num_blocks - 1); idle cached blocks count as free.
  double usage() const;
  // Blocks that carry a hash now.
  uint64_t cached_blocks() const { return by_hash_.size(); }

  // The cached blocks named by hashes[0], hashes[1], ..., up to the first one not cached; nothing
  // is touched.
  std::vector<uint32_t> longest_hit(std::span<const uint64_t> hashes) const;
  // How many of `blocks` have no reference (taking them costs as many free blocks).
  uint32_t count_unreferenced(std::span<const uint32_t> blocks) const;
  // One more reference to each; a block with none leaves the free queue.
  void touch(std::span<const uint32_t> blocks);
  // Takes n <= free_blocks() blocks from the queue's head, each with one reference; a cached one
  // loses its hash (a BlockRemoved event).
  void allocate(uint32_t n, std::vector<uint32_t>* out);
  // One reference less to each; those left with none join the queue's tail, in this order.
  void release(std::span<const uint32_t> blocks);
  // Names a referenced block that has no hash yet.
  void set_hash(uint32_t block, uint64_t hash);
  // A run of blocks the caller just named (BlockStored), kept in order with the evictions.
  void note_stored(PrefixCacheChange change);
  std::vector<PrefixCacheChange> take_events();

  // vLLM's reset_prefix_cache: only when no block is referenced (false otherwise, nothing
  // changes): every hash is dropped without events (the caller announces AllBlocksCleared).
  bool reset_prefix_cache();

  uint64_t stored_total() const { return stored_total_; }
  uint64_t evicted_total() const { return evicted_total_; }

 private:
  struct Block {
    uint32_t refs = 0;
    bool hashed = false;
    uint64_t hash = 0;
    uint32_t prev = 0;  // free queue links (indices; kNone when not queued)
    uint32_t next = 0;
  };
  static constexpr uint32_t kNone = UINT32_MAX;

  void unlink(uint32_t id);
  void push_back(uint32_t id);
  void drop_hash(uint32_t id, bool announce);

  std::vector<Block> blocks_;
  uint32_t head_ = kNone;
  uint32_t tail_ = kNone;
  uint32_t free_count_ = 0;
  std::unordered_multimap<uint64_t, uint32_t> by_hash_;
  std::vector<PrefixCacheChange> events_;
  uint64_t stored_total_ = 0;
  uint64_t evicted_total_ = 0;
};

}  // namespace pdr::node::sim
