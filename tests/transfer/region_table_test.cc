#include "transfer/core/region_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace pdr::transfer {
namespace {

TEST(RegionTable, RegisterResolveUnregister) {
  std::vector<std::byte> pool(4096);
  RegionTable table;
  RegionId id = kInvalidRegion;
  ASSERT_TRUE(table.register_region(pool.data(), pool.size(), MemKind::kHostDram, &id).is_ok());
  EXPECT_NE(id, kInvalidRegion);
  EXPECT_EQ(table.size(), 1u);

  std::byte* p = nullptr;
  ASSERT_TRUE(table.resolve(id, 0, 4096, &p).is_ok());
  EXPECT_EQ(p, pool.data());
  ASSERT_TRUE(table.resolve(id, 100, 28, &p).is_ok());
  EXPECT_EQ(p, pool.data() + 100);
  ASSERT_TRUE(table.resolve(id, 4096, 0, &p).is_ok());  // empty span at the end
  EXPECT_EQ(p, pool.data() + 4096);

  auto region = table.lookup(id);
  ASSERT_TRUE(region.has_value());
  EXPECT_EQ(region->length, 4096u);
  EXPECT_EQ(region->kind, MemKind::kHostDram);

  ASSERT_TRUE(table.unregister_region(id).is_ok());
  EXPECT_EQ(table.size(), 0u);
  EXPECT_EQ(table.resolve(id, 0, 1, &p).code(), StatusCode::kNotFound);
  EXPECT_EQ(table.unregister_region(id).code(), StatusCode::kNotFound);
  EXPECT_FALSE(table.lookup(id).has_value());
}

TEST(RegionTable, BoundsAndOverflowAttempts) {
  std::vector<std::byte> pool(1000);
  RegionTable table;
  RegionId id = kInvalidRegion;
  ASSERT_TRUE(table.register_region(pool.data(), pool.size(), MemKind::kHostDram, &id).is_ok());
  std::byte* p = nullptr;
  struct Case {
    std::uint64_t offset, length;
  };
  const Case bad[] = {
      {0, 1001},
      {1, 1000},
      {999, 2},
      {1000, 1},
      {1001, 0},
      {UINT64_MAX, 0},
      {UINT64_MAX, 1},
      {UINT64_MAX, UINT64_MAX},
      {1, UINT64_MAX},
      {0, UINT64_MAX},
      {500, UINT64_MAX - 499},  // offset + length wraps to 0
      {UINT64_MAX - 10, 20},    // wraps to 9
  };
  for (const Case& c : bad) {
    p = nullptr;
    Status status = table.resolve(id, c.offset, c.length, &p);
    EXPECT_EQ(status.code(), StatusCode::kOutOfRange) << c.offset << "+" << c.length;
    EXPECT_EQ(p, nullptr);
  }
  EXPECT_TRUE(table.resolve(id, 999, 1, &p).is_ok());
}

TEST(RegionTable, RejectsBadRegistrations) {
  RegionTable table;
  RegionId id = kInvalidRegion;
  std::byte b[8];
  EXPECT_EQ(table.register_region(nullptr, 8, MemKind::kHostDram, &id).code(),
            StatusCode::kInvalidValue);
  EXPECT_EQ(table.register_region(b, 0, MemKind::kHostDram, &id).code(),
            StatusCode::kInvalidValue);
  EXPECT_EQ(table.register_region(b, UINT64_MAX, MemKind::kHostDram, &id).code(),
            StatusCode::kInvalidValue);
  // The device kind is opaque: its address is never dereferenced, only bounds-checked.
  const void* top = reinterpret_cast<const void*>(UINTPTR_MAX - 15);
  EXPECT_TRUE(table.register_region(top, 16, MemKind::kDevice, &id).is_ok());
  EXPECT_EQ(table.register_region(top, 17, MemKind::kDevice, &id).code(),
            StatusCode::kInvalidValue);
}

TEST(RegionTable, UnknownIdsAreNotFound) {
  RegionTable table(4);
  std::byte* p = nullptr;
  EXPECT_EQ(table.resolve(kInvalidRegion, 0, 0, &p).code(), StatusCode::kNotFound);
  EXPECT_EQ(table.resolve(3, 0, 0, &p).code(), StatusCode::kNotFound);
  EXPECT_EQ(table.resolve(0xFFFFFFFFu, 0, 0, &p).code(), StatusCode::kNotFound);
  EXPECT_EQ(table.resolve(0x10005u, 0, 0, &p).code(), StatusCode::kNotFound);  // index >= cap
}

TEST(RegionTable, FullTableRejectsAndSlotsAreReusedWithNewGeneration) {
  std::vector<std::byte> pool(64);
  RegionTable table(3);
  EXPECT_EQ(table.capacity(), 3u);
  RegionId ids[3];
  for (RegionId& id : ids) {
    ASSERT_TRUE(table.register_region(pool.data(), pool.size(), MemKind::kHostDram, &id).is_ok());
  }
  // Dense: slot indexes 0, 1, 2.
  EXPECT_EQ(ids[0] & 0xFFFFu, 0u);
  EXPECT_EQ(ids[1] & 0xFFFFu, 1u);
  EXPECT_EQ(ids[2] & 0xFFFFu, 2u);
  RegionId extra = kInvalidRegion;
  EXPECT_EQ(table.register_region(pool.data(), 8, MemKind::kHostDram, &extra).code(),
            StatusCode::kRejected);

  ASSERT_TRUE(table.unregister_region(ids[1]).is_ok());
  RegionId reused = kInvalidRegion;
  ASSERT_TRUE(table.register_region(pool.data(), 8, MemKind::kHostShared, &reused).is_ok());
  EXPECT_EQ(reused & 0xFFFFu, 1u);  // the lowest free slot
  EXPECT_NE(reused, ids[1]);        // ...under a new generation
  std::byte* p = nullptr;
  EXPECT_EQ(table.resolve(ids[1], 0, 1, &p).code(), StatusCode::kNotFound);  // stale id
  EXPECT_TRUE(table.resolve(reused, 0, 8, &p).is_ok());
  EXPECT_EQ(table.resolve(reused, 0, 9, &p).code(), StatusCode::kOutOfRange);
}

TEST(RegionTable, GenerationWrapsWithoutIssuingIdZero) {
  std::vector<std::byte> pool(8);
  RegionTable table(1);
  for (int i = 0; i < 70000; ++i) {
    RegionId id = kInvalidRegion;
    ASSERT_TRUE(table.register_region(pool.data(), 8, MemKind::kHostDram, &id).is_ok());
    ASSERT_NE(id, kInvalidRegion);
    ASSERT_TRUE(table.unregister_region(id).is_ok());
  }
}

// Readers resolving while a writer keeps re-registering the same slot with two different regions
// must see either region whole, never the address of one with the length of the other.
TEST(RegionTable, ConcurrentResolveSeesConsistentSlots) {
  std::vector<std::byte> small(16), large(1 << 16);
  RegionTable table(2);
  std::atomic<RegionId> current{kInvalidRegion};
  std::atomic<bool> stop{false};
  RegionId id = kInvalidRegion;
  ASSERT_TRUE(table.register_region(small.data(), small.size(), MemKind::kHostDram, &id).is_ok());
  current.store(id);

  std::atomic<long> resolved{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const RegionId rid = current.load(std::memory_order_relaxed);
        auto region = table.lookup(rid);
        if (!region) continue;
        const bool is_small = region->addr == reinterpret_cast<std::uintptr_t>(small.data()) &&
                              region->length == small.size();
        const bool is_large = region->addr == reinterpret_cast<std::uintptr_t>(large.data()) &&
                              region->length == large.size();
        ASSERT_TRUE(is_small || is_large);
        std::byte* p = nullptr;
        if (table.resolve(rid, 0, 1024, &p).is_ok()) {
          ASSERT_EQ(p, large.data());
          resolved.fetch_add(1, std::memory_order_relaxed);
        }
      }
    });
  }
  for (int i = 0; i < 20000; ++i) {
    RegionId old = current.load();
    ASSERT_TRUE(table.unregister_region(old).is_ok());
    std::vector<std::byte>& next = (i % 2 == 0) ? large : small;
    RegionId fresh = kInvalidRegion;
    ASSERT_TRUE(
        table.register_region(next.data(), next.size(), MemKind::kHostDram, &fresh).is_ok());
    current.store(fresh);
  }
  stop.store(true);
  for (std::thread& t : readers) t.join();
}

}  // namespace
}  // namespace pdr::transfer
