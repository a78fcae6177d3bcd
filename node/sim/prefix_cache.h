// SimPrefixCache: the prefix cache of one simulated engine (one DP rank of `pdnode sim`), as
// vLLM's v1 KV cache manager keeps it: a prompt's token ids cut into full blocks of
// `block_tokens`, each block named by a hash chained over its parent's hash and its own tokens,
// and an LRU of those hashes bounded by `capacity_blocks`.
//
// process() is what happens to one request's prompt: the longest prefix of full blocks already
// cached is a hit (at most (tokens - 1) / block_tokens blocks are looked up, since vLLM always
// computes the prompt's last token itself); then every full block of the prompt is stored (a
// block stored earlier is only touched), least recently used blocks being evicted to make room.
// The blocks are touched last block first, so a prompt's first blocks are the most recently used
// and a chain is evicted from its tail, as vLLM frees a request's blocks in reverse order.
//
// The answer lists what changed, in order, in vLLM's KV event terms: runs of newly stored blocks
// (BlockStored: hashes, the parent hash of the first, their tokens) and of evicted ones
// (BlockRemoved). clear() empties the cache (AllBlocksCleared).
//
// Hashes: FNV-1a-64 over (parent hash, the block's token ids as little-endian u32), the chain
// starting from a fixed seed. Not vLLM's sha256 (routers consuming the events rehash tokens
// themselves; docs/design/kv-events.md), but stable across runs and nodes, which tests rely on.
//
// Threads: every method takes the cache's mutex; any worker may call them.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace pdr::node::sim {

// One change to the cache: a run of blocks stored (each one's parent is the previous; `parent`
// is the hash of the block before the first, none at the prompt's start; `tokens` holds
// block_tokens per block) or evicted (least recently used first; no parent, no tokens).
struct PrefixCacheChange {
  bool stored = true;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;
  std::vector<uint32_t> tokens;
};

struct PrefixCacheUpdate {
  uint32_t queried_tokens = 0;  // the prompt's tokens
  uint32_t cached_tokens = 0;   // a multiple of block_tokens
  std::vector<PrefixCacheChange> changes;  // in the order they happened
};

struct PrefixCacheStats {
  uint64_t blocks = 0;          // held now
  uint64_t capacity_blocks = 0;
  uint64_t block_tokens = 0;
  uint64_t queries = 0;          // process() calls
  uint64_t queried_tokens = 0;
  uint64_t hit_tokens = 0;
  uint64_t stored_blocks = 0;
  uint64_t evicted_blocks = 0;
  uint64_t clears = 0;
};

class SimPrefixCache {
 public:
  // block_tokens >= 1, capacity_blocks >= 1.
  SimPrefixCache(uint32_t block_tokens, uint32_t capacity_blocks);

  // `store`: false only looks up (nothing is stored, touched or evicted).
  PrefixCacheUpdate process(const std::vector<uint32_t>& tokens, bool store = true);
  // Empties the cache; returns how many blocks it held.
  uint64_t clear();
  PrefixCacheStats stats() const;

  // The chained hash of a block (exposed for tests).
  static uint64_t block_hash(std::optional<uint64_t> parent, const uint32_t* tokens, size_t count);

 private:
  const uint32_t block_tokens_;
  const uint32_t capacity_;
  mutable std::mutex mutex_;
  std::list<uint64_t> lru_;  // front: most recently used
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> blocks_;
  PrefixCacheStats stats_;
};

}  // namespace pdr::node::sim
