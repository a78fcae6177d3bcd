#include "node/sim/kv_blocks.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

namespace pdr::node::sim {
namespace {

TEST(KvBlockPool, AllocatesDistinctIdsAllOrNothing) {
  KvBlockPool pool(8);
  std::vector<uint32_t> a;
  ASSERT_TRUE(pool.allocate(5, &a));
  EXPECT_EQ(a, (std::vector<uint32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(pool.held(), 5u);
  std::vector<uint32_t> b;
  EXPECT_FALSE(pool.allocate(4, &b));  // only 3 left: nothing taken
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool.held(), 5u);
  ASSERT_TRUE(pool.allocate(3, &b));
  EXPECT_EQ(pool.held(), 8u);
  EXPECT_TRUE(pool.allocate(0, &b));
}

TEST(KvBlockPool, ReleaseRefusesDoubleFreeAndForeignIds) {
  KvBlockPool pool(4);
  std::vector<uint32_t> a;
  ASSERT_TRUE(pool.allocate(2, &a));
  EXPECT_EQ(pool.release(a), 0u);
  EXPECT_EQ(pool.held(), 0u);
  EXPECT_EQ(pool.release(a), 2u);  // double free
  const std::vector<uint32_t> foreign{3, 4, 100};
  EXPECT_EQ(pool.release(foreign), 3u);  // 3 is free, 4 and 100 out of range
  std::vector<uint32_t> all;
  EXPECT_TRUE(pool.allocate(4, &all));  // the free list is intact
  EXPECT_EQ(std::set<uint32_t>(all.begin(), all.end()), (std::set<uint32_t>{0, 1, 2, 3}));
}

TEST(KvBlockPool, ConcurrentUseKeepsIdsUnique) {
  KvBlockPool pool(64);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&pool] {
      for (int i = 0; i < 2000; ++i) {
        std::vector<uint32_t> ids;
        if (pool.allocate(5, &ids)) {
          EXPECT_EQ(std::set<uint32_t>(ids.begin(), ids.end()).size(), 5u);
          EXPECT_EQ(pool.release(ids), 0u);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(pool.held(), 0u);
}

}  // namespace
}  // namespace pdr::node::sim
