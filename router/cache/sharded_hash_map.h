// ShardedHashMap<V>: a hash map from 64-bit keys a peer chooses (KV cache block hashes) that
// stays fast whatever keys arrive and never pauses long to grow.
//
//   - Keys are hashed with KeyedHash64 (proto/base/keyed_hash.h), a keyed PRF: a peer cannot aim keys at
//     one bucket, so each operation costs O(1) expected whatever it sends.
//   - The entries are spread over kShards std::unordered_maps by the keyed hash's top bits. A
//     std::unordered_map grows by rehashing every element at once; split 64 ways, the largest
//     single rehash touches about 1/64 of the entries (62,500 of 4,000,000: a few milliseconds)
//     rather than all of them, which bounds how long a caller holding a lock can pause on it.
//
// Elements never move: a pointer to an element (value_type*) stays valid until that element is
// erased, across inserts, rehashes and moves of the map, as with std::unordered_map.
// Not thread-safe; the owner locks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>

#include "proto/base/keyed_hash.h"

namespace pdr::router::cache {

template <typename V>
class ShardedHashMap {
 public:
  static constexpr size_t kShards = 64;
  using Map = std::unordered_map<uint64_t, V, KeyedHash64>;
  using value_type = typename Map::value_type;  // std::pair<const uint64_t, V>

  value_type* find(uint64_t key) {
    Map& m = shard_of(key);
    auto it = m.find(key);
    return it == m.end() ? nullptr : &*it;
  }
  const value_type* find(uint64_t key) const {
    const Map& m = shards_[shard_index(key)];
    auto it = m.find(key);
    return it == m.end() ? nullptr : &*it;
  }
  // The element for `key`, inserted from `args` if absent; second: whether it was inserted.
  template <typename... Args>
  std::pair<value_type*, bool> try_emplace(uint64_t key, Args&&... args) {
    auto [it, inserted] = shard_of(key).try_emplace(key, std::forward<Args>(args)...);
    if (inserted) ++size_;
    return {&*it, inserted};
  }
  // False when `key` is absent.
  bool erase(uint64_t key) {
    if (shard_of(key).erase(key) == 0) return false;
    --size_;
    return true;
  }
  // Erases up to `max` elements (any of them), calling f(value_type&) on each just before it goes;
  // returns how many went. Draining a map one bounded slice at a time costs O(max + kShards).
  template <typename F>
  size_t drain(size_t max, F&& f) {
    size_t n = 0;
    for (Map& m : shards_) {
      while (n < max && !m.empty()) {
        auto it = m.begin();
        f(*it);
        m.erase(it);
        --size_;
        ++n;
      }
      if (n == max) break;
    }
    return n;
  }
  // How many elements inserting `key` may make the map move at once: the size of key's shard when
  // a new element would make that shard grow its bucket array (std::unordered_map then relinks
  // every element of it), else 0. Conservative: it does not look whether `key` is present.
  size_t growth_cost(uint64_t key) const {
    const Map& m = shards_[shard_index(key)];
    return static_cast<double>(m.size() + 1) >= static_cast<double>(m.bucket_count()) * m.max_load_factor()
               ? m.size()
               : 0;
  }
  size_t size() const { return size_; }
  // Buckets over all shards (8 bytes each).
  size_t bucket_count() const {
    size_t n = 0;
    for (const Map& m : shards_) n += m.bucket_count();
    return n;
  }
  bool empty() const { return size_ == 0; }
  template <typename F>
  void for_each(F&& f) const {
    for (const Map& m : shards_) {
      for (const value_type& v : m) f(v);
    }
  }

 private:
  static size_t shard_index(uint64_t key) { return KeyedHash64{}(key) >> (64 - 6); }
  static_assert(kShards == size_t{1} << 6 && sizeof(size_t) == sizeof(uint64_t));
  Map& shard_of(uint64_t key) { return shards_[shard_index(key)]; }

  std::array<Map, kShards> shards_;
  size_t size_ = 0;
};

}  // namespace pdr::router::cache
