// SnapshotCell/SnapshotReader under concurrency: readers only ever see complete, monotonically
// newer values, and see the last one published. Meaningful under TSan (tests/run.sh's TSan stage).
#include "proto/base/snapshot_cell.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace pdr {
namespace {

struct Value {
  uint64_t n = 0;
  std::vector<uint64_t> copies;  // every element equals n: a torn value would show
};

TEST(SnapshotCell, ReadersSeeWholeMonotonicValues) {
  constexpr uint64_t kPublishes = 20000;
  SnapshotCell<Value> cell;
  std::atomic<bool> done{false};
  std::atomic<uint64_t> bad{0};

  auto reader = [&] {
    SnapshotReader<Value> r(cell);
    uint64_t last = 0;
    while (true) {
      const bool finished = done.load(std::memory_order_acquire);
      const Value& v = *r.get();
      if (v.n < last) bad++;
      for (uint64_t c : v.copies) if (c != v.n) bad++;
      last = v.n;
      if (finished) {
        if (last != kPublishes) bad++;  // after the writer finished, the newest must be visible
        return;
      }
    }
  };
  std::thread r1(reader), r2(reader);
  for (uint64_t i = 1; i <= kPublishes; ++i) {
    auto v = std::make_shared<Value>();
    v->n = i;
    v->copies.assign(8, i);
    cell.publish(std::move(v));
  }
  done.store(true, std::memory_order_release);
  r1.join();
  r2.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_EQ(cell.version(), kPublishes);
}

TEST(SnapshotCell, ReaderKeepsItsSnapshotAliveAfterNewerPublishes) {
  SnapshotCell<Value> cell;
  auto first = std::make_shared<Value>();
  first->n = 1;
  cell.publish(first);
  SnapshotReader<Value> reader(cell);
  std::shared_ptr<const Value> held = reader.get();
  first.reset();
  auto second = std::make_shared<Value>();
  second->n = 2;
  cell.publish(second);
  EXPECT_EQ(held->n, 1u);          // still valid: shared ownership
  EXPECT_EQ(reader.get()->n, 2u);  // and the reader moves on
}

}  // namespace
}  // namespace pdr
