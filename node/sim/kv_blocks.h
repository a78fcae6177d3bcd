// KvBlockPool: the free list of one `pdnode sim`'s KV blocks (ids 0..count-1).
//
// allocate() is all or nothing (a request needs all its blocks); release() refuses ids that are
// out of range or not allocated, so a double free is reported instead of corrupting the list.
// Thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

namespace pdr::node::sim {

class KvBlockPool {
 public:
  explicit KvBlockPool(uint32_t count);

  // Appends `n` free ids to *out and returns true, or returns false and changes nothing when
  // fewer than `n` are free.
  bool allocate(uint32_t n, std::vector<uint32_t>* out);
  // Frees every valid allocated id in `ids`; returns how many were refused (out of range or not
  // allocated).
  uint32_t release(std::span<const uint32_t> ids);

  uint32_t capacity() const { return static_cast<uint32_t>(allocated_.size()); }
  uint32_t held() const;  // allocated now

 private:
  mutable std::mutex mu_;
  std::vector<uint32_t> free_;      // LIFO: recently freed blocks are reused first
  std::vector<bool> allocated_;
  uint32_t held_ = 0;
};

}  // namespace pdr::node::sim
