// ShardedHashMap: a keyed, sharded map whose elements never move and whose growth is announced.
#include "router/cache/sharded_hash_map.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace pdr::router::cache {
namespace {

TEST(ShardedHashMap, FindInsertEraseAndSize) {
  ShardedHashMap<int> m;
  EXPECT_TRUE(m.empty());
  auto [a, inserted] = m.try_emplace(7, 70);
  EXPECT_TRUE(inserted);
  EXPECT_EQ(a->first, 7u);
  EXPECT_EQ(a->second, 70);
  auto [again, inserted_again] = m.try_emplace(7, 71);
  EXPECT_FALSE(inserted_again);
  EXPECT_EQ(again, a);
  EXPECT_EQ(again->second, 70);
  EXPECT_EQ(m.size(), 1u);
  EXPECT_EQ(m.find(7), a);
  EXPECT_EQ(m.find(8), nullptr);
  EXPECT_FALSE(m.erase(8));
  EXPECT_TRUE(m.erase(7));
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.find(7), nullptr);
}

TEST(ShardedHashMap, ElementsStayPutWhileTheMapGrows) {
  ShardedHashMap<uint64_t> m;
  std::vector<ShardedHashMap<uint64_t>::value_type*> first;
  for (uint64_t k = 0; k < 1000; ++k) first.push_back(m.try_emplace(k * 13, k).first);
  for (uint64_t k = 1000; k < 100000; ++k) m.try_emplace(k * 13, k);
  for (uint64_t k = 0; k < 1000; ++k) {
    ASSERT_EQ(m.find(k * 13), first[k]);
    ASSERT_EQ(first[k]->second, k);
  }
  EXPECT_EQ(m.size(), 100000u);
}

TEST(ShardedHashMap, DrainErasesInBoundedSlices) {
  ShardedHashMap<int> m;
  for (uint64_t k = 0; k < 1000; ++k) m.try_emplace(k, 1);
  size_t seen = 0, rounds = 0;
  while (!m.empty()) {
    const size_t n = m.drain(300, [&](ShardedHashMap<int>::value_type& v) { seen += static_cast<size_t>(v.second); });
    EXPECT_LE(n, 300u);
    ++rounds;
  }
  EXPECT_EQ(seen, 1000u);
  EXPECT_EQ(rounds, 4u);
  EXPECT_EQ(m.drain(10, [](auto&) {}), 0u);
}

// Every insert that grows a shard's bucket array (and so relinks its elements) was announced by
// growth_cost() beforehand, with that shard's size: about a 64th of the map, never all of it.
// Only a shard's first insert, which has nothing to move, goes unannounced.
TEST(ShardedHashMap, GrowthIsAnnouncedWithItsCost) {
  constexpr size_t kShards = ShardedHashMap<int>::kShards;
  ShardedHashMap<int> m;
  size_t silent = 0, announced = 0;
  for (uint64_t k = 1; k <= 100000; ++k) {
    const uint64_t key = k * 172933;  // multiples of a libstdc++ bucket count
    const size_t cost = m.growth_cost(key);
    const size_t buckets = m.bucket_count();
    m.try_emplace(key, 0);
    if (m.bucket_count() == buckets) continue;
    if (cost == 0) {
      ++silent;
    } else {
      ++announced;
      EXPECT_LE(cost, 2 * m.size() / kShards + 64);
    }
  }
  EXPECT_LE(silent, kShards);
  EXPECT_GT(announced, kShards);
}

}  // namespace
}  // namespace pdr::router::cache
