#include "node/sim/kv_blocks.h"

namespace pdr::node::sim {

KvBlockPool::KvBlockPool(uint32_t count) : allocated_(count, false) {
  free_.reserve(count);
  for (uint32_t id = count; id-- > 0;) free_.push_back(id);  // hand out 0, 1, 2... first
}

bool KvBlockPool::allocate(uint32_t n, std::vector<uint32_t>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (n > free_.size()) return false;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t id = free_.back();
    free_.pop_back();
    allocated_[id] = true;
    out->push_back(id);
  }
  held_ += n;
  return true;
}

uint32_t KvBlockPool::release(std::span<const uint32_t> ids) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t refused = 0;
  for (uint32_t id : ids) {
    if (id >= allocated_.size() || !allocated_[id]) {
      ++refused;
      continue;
    }
    allocated_[id] = false;
    free_.push_back(id);
    --held_;
  }
  return refused;
}

uint32_t KvBlockPool::held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

}  // namespace pdr::node::sim
