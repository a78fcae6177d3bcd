#include "node/sim/prefix_cache.h"

#include <algorithm>

namespace pdr::node::sim {
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ULL;
constexpr uint64_t kFnvPrime = 1099511628211ULL;
// The chain's start (vLLM's NONE_HASH plays this part).
constexpr uint64_t kChainSeed = 0x7064726f75746572ULL;  // "pdrouter"

uint64_t mix(uint64_t hash, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    hash ^= (value >> (8 * i)) & 0xff;
    hash *= kFnvPrime;
  }
  return hash;
}

}  // namespace

SimPrefixCache::SimPrefixCache(uint32_t block_tokens, uint32_t capacity_blocks)
    : block_tokens_(std::max<uint32_t>(1, block_tokens)),
      capacity_(std::max<uint32_t>(1, capacity_blocks)) {
  stats_.capacity_blocks = capacity_;
  stats_.block_tokens = block_tokens_;
}

uint64_t SimPrefixCache::block_hash(std::optional<uint64_t> parent, const uint32_t* tokens,
                                    size_t count) {
  uint64_t hash = mix(kFnvOffset, parent.value_or(kChainSeed), 8);
  for (size_t i = 0; i < count; ++i) hash = mix(hash, tokens[i], 4);
  return hash;
}

PrefixCacheUpdate SimPrefixCache::process(const std::vector<uint32_t>& tokens, bool store) {
  PrefixCacheUpdate update;
  update.queried_tokens = static_cast<uint32_t>(tokens.size());
  const size_t full_blocks = tokens.size() / block_tokens_;
  // vLLM computes at least the prompt's last token, so a fully cached prompt still misses its
  // last block (KVCacheManager::get_computed_blocks, max_cache_hit_length = tokens - 1).
  const size_t lookup_blocks = tokens.empty() ? 0 : (tokens.size() - 1) / block_tokens_;
  std::vector<uint64_t> hashes;
  hashes.reserve(full_blocks);
  std::optional<uint64_t> parent;
  for (size_t b = 0; b < full_blocks; ++b) {
    parent = block_hash(parent, tokens.data() + b * block_tokens_, block_tokens_);
    hashes.push_back(*parent);
  }

  std::lock_guard<std::mutex> lock(mutex_);
  size_t hit_blocks = 0;
  while (hit_blocks < lookup_blocks && blocks_.contains(hashes[hit_blocks])) ++hit_blocks;
  update.cached_tokens = static_cast<uint32_t>(hit_blocks * block_tokens_);
  ++stats_.queries;
  stats_.queried_tokens += update.queried_tokens;
  stats_.hit_tokens += update.cached_tokens;
  if (!store) return update;

  // Stored in prompt order; a block found cached only moves up in the LRU. A prompt longer
  // than the whole cache keeps only what fits (its first blocks end up evicted by its last).
  auto& changes = update.changes;
  for (size_t b = 0; b < full_blocks; ++b) {
    auto it = blocks_.find(hashes[b]);
    if (it != blocks_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      continue;
    }
    while (blocks_.size() >= capacity_) {
      const uint64_t victim = lru_.back();
      lru_.pop_back();
      blocks_.erase(victim);
      if (changes.empty() || changes.back().stored) changes.push_back({.stored = false});
      changes.back().hashes.push_back(victim);
      ++stats_.evicted_blocks;
    }
    lru_.push_front(hashes[b]);
    blocks_.emplace(hashes[b], lru_.begin());
    const bool extends = !changes.empty() && changes.back().stored && b > 0 &&
                         changes.back().hashes.back() == hashes[b - 1];
    if (!extends) {
      changes.push_back({.stored = true});
      if (b > 0) changes.back().parent = hashes[b - 1];
    }
    changes.back().hashes.push_back(hashes[b]);
    changes.back().tokens.insert(changes.back().tokens.end(), tokens.begin() + b * block_tokens_,
                                 tokens.begin() + (b + 1) * block_tokens_);
    ++stats_.stored_blocks;
  }
  // Last block first: the prompt's first blocks end most recently used.
  for (size_t b = full_blocks; b-- > 0;) {
    auto it = blocks_.find(hashes[b]);
    if (it != blocks_.end()) lru_.splice(lru_.begin(), lru_, it->second);
  }
  stats_.blocks = blocks_.size();
  return update;
}

uint64_t SimPrefixCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t held = blocks_.size();
  blocks_.clear();
  lru_.clear();
  stats_.blocks = 0;
  ++stats_.clears;
  return held;
}

PrefixCacheStats SimPrefixCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace pdr::node::sim
