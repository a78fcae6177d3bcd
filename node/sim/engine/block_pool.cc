#include "node/sim/engine/block_pool.h"

#include <algorithm>
#include <cassert>
#include <utility>

namespace pdr::node::sim {

EngineBlockPool::EngineBlockPool(uint32_t num_blocks) : blocks_(std::max<uint32_t>(2, num_blocks)) {
  // Block 0 stays out of the queue for good: vLLM's null block.
  blocks_[0].refs = 1;
  blocks_[0].prev = blocks_[0].next = kNone;
  for (uint32_t id = 1; id < blocks_.size(); ++id) push_back(id);
}

double EngineBlockPool::usage() const {
  const double usable = static_cast<double>(blocks_.size() - 1);
  return 1.0 - static_cast<double>(free_count_) / usable;
}

std::vector<uint32_t> EngineBlockPool::longest_hit(std::span<const uint64_t> hashes) const {
  std::vector<uint32_t> hit;
  for (uint64_t hash : hashes) {
    auto it = by_hash_.find(hash);
    if (it == by_hash_.end()) break;
    hit.push_back(it->second);
  }
  return hit;
}

uint32_t EngineBlockPool::count_unreferenced(std::span<const uint32_t> blocks) const {
  uint32_t n = 0;
  for (uint32_t id : blocks) n += blocks_[id].refs == 0 ? 1 : 0;
  return n;
}

void EngineBlockPool::touch(std::span<const uint32_t> blocks) {
  for (uint32_t id : blocks) {
    if (blocks_[id].refs++ == 0) unlink(id);
  }
}

void EngineBlockPool::allocate(uint32_t n, std::vector<uint32_t>* out) {
  assert(n <= free_count_);
  for (uint32_t i = 0; i < n && head_ != kNone; ++i) {
    const uint32_t id = head_;
    unlink(id);
    drop_hash(id, /*announce=*/true);
    blocks_[id].refs = 1;
    out->push_back(id);
  }
}

void EngineBlockPool::release(std::span<const uint32_t> blocks) {
  for (uint32_t id : blocks) {
    assert(blocks_[id].refs > 0);
    if (--blocks_[id].refs == 0) push_back(id);
  }
}

void EngineBlockPool::set_hash(uint32_t block, uint64_t hash) {
  Block& b = blocks_[block];
  assert(!b.hashed);
  b.hashed = true;
  b.hash = hash;
  by_hash_.emplace(hash, block);
  ++stored_total_;
}

void EngineBlockPool::note_stored(PrefixCacheChange change) { events_.push_back(std::move(change)); }

std::vector<PrefixCacheChange> EngineBlockPool::take_events() { return std::exchange(events_, {}); }

bool EngineBlockPool::reset_prefix_cache() {
  if (free_count_ != blocks_.size() - 1) return false;
  for (uint32_t id = 1; id < blocks_.size(); ++id) drop_hash(id, /*announce=*/false);
  events_.clear();  // superseded by the AllBlocksCleared the caller sends
  return true;
}

void EngineBlockPool::drop_hash(uint32_t id, bool announce) {
  Block& b = blocks_[id];
  if (!b.hashed) return;
  auto [first, last] = by_hash_.equal_range(b.hash);
  for (auto it = first; it != last; ++it) {
    if (it->second == id) {
      by_hash_.erase(it);
      break;
    }
  }
  b.hashed = false;
  if (!announce) return;
  ++evicted_total_;
  if (events_.empty() || events_.back().stored) events_.push_back({.stored = false});
  events_.back().hashes.push_back(b.hash);
}

void EngineBlockPool::unlink(uint32_t id) {
  Block& b = blocks_[id];
  if (b.prev != kNone) blocks_[b.prev].next = b.next; else head_ = b.next;
  if (b.next != kNone) blocks_[b.next].prev = b.prev; else tail_ = b.prev;
  b.prev = b.next = kNone;
  --free_count_;
}

void EngineBlockPool::push_back(uint32_t id) {
  Block& b = blocks_[id];
  b.prev = tail_;
  b.next = kNone;
  if (tail_ != kNone) blocks_[tail_].next = id; else head_ = id;
  tail_ = id;
  ++free_count_;
}

}  // namespace pdr::node::sim
