// BlockIndex under a node that sends big or crafted batches: writers take the exclusive lock in
// bounded slices, lookups run between them, drops vanish at once and are erased in slices, and
// engine hashes aimed at libstdc++'s bucket counts cost what random ones do. (Threaded: runs
// under TSan too; the single-threaded behaviour is block_index_test.cc.)
#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "router/cache/block_index.h"
#include "tests/support/time_scale.h"

namespace pdr::router::cache {
namespace {

using proto::KvEvent;
using proto::KvEventBatch;
using proto::KvEventKind;

constexpr uint32_t kBlock = 4;
constexpr size_t kSlice = BlockIndex::kSliceBlocks;

// Token ids first, first+1, ...: `blocks` blocks of them.
std::vector<uint32_t> tokens(uint32_t first, size_t blocks) {
  std::vector<uint32_t> t(blocks * kBlock);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A BlockStored of `blocks` chained blocks with engine hashes base+1, base+2, ... holding `toks`.
KvEvent stored(uint64_t base, std::vector<uint32_t> toks, std::optional<proto::EngineHash> parent = std::nullopt) {
  KvEvent e;
  e.kind = KvEventKind::kBlockStored;
  e.block_size = kBlock;
  e.parent_block_hash = parent;
  for (size_t i = 0; i < toks.size() / kBlock; ++i) e.block_hashes.push_back(base + 1 + i);
  e.token_ids = std::move(toks);
  return e;
}

KvEvent removed(uint64_t from, uint64_t to) {  // engine hashes [from, to]
  KvEvent e;
  e.kind = KvEventKind::kBlockRemoved;
  for (uint64_t h = from; h <= to; ++h) e.block_hashes.push_back(h);
  return e;
}

KvEvent cleared() {
  KvEvent e;
  e.kind = KvEventKind::kAllBlocksCleared;
  return e;
}

KvEventBatch batch(std::vector<KvEvent> events) {
  KvEventBatch b;
  b.events = std::move(events);
  return b;
}

uint32_t matched(const BlockIndex& index, std::string_view node, const std::vector<uint32_t>& request) {
  for (const PrefixMatch& m : index.longest_prefix(request)) {
    if (m.node == node) return m.matched_blocks;
  }
  return 0;
}

// A batch of 3 slices and more: every slice ends with the lock free (the hook, on the writing
// thread, looks up, which would deadlock under a held lock), a lookup between slices sees the
// stores of a prefix of the batch, and at the end all of it has landed, in order: a chain's
// removal after its store leaves nothing of it, and the last event chains from the first.
TEST(BlockIndexSlices, ABatchLargerThanASliceLandsWholeAndInOrder) {
  BlockIndex index;
  const size_t n = 3 * kSlice + 100;
  const auto chain = tokens(0, n);
  const auto other = tokens(2'000'000, 100);
  const auto tail = tokens(1'000'000, 10);
  std::vector<uint32_t> seen;
  index.set_slice_hook_for_testing([&] { seen.push_back(matched(index, "n1", chain)); });
  index.apply("n1", 0, batch({stored(0, chain), stored(800'000, other), removed(800'001, 800'100),
                              stored(500'000, tail, /*parent=*/n)}));

  ASSERT_GE(seen.size(), 4u);
  EXPECT_GT(seen.front(), 0u);  // the first slice's stores were visible before the batch ended
  EXPECT_LT(seen.front(), n);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GE(seen[i], seen[i - 1]) << "slice " << i << ": in order";
  EXPECT_EQ(seen.back(), n);
  std::vector<uint32_t> longer = chain;
  longer.insert(longer.end(), tail.begin(), tail.end());
  EXPECT_EQ(matched(index, "n1", longer), n + 10);
  EXPECT_EQ(matched(index, "n1", other), 0u);
  EXPECT_EQ(index.stats().entries, n + 10);
  EXPECT_EQ(index.stats().blocks_stored, n + 100 + 10);
  EXPECT_EQ(index.stats().blocks_removed, 100u);
}

// While one thread applies a big batch, another thread's lookup completes between every two
// slices: the hook (writer thread) asks the reader for a lookup and waits for its answer. Had the
// writer kept the lock, the reader could not answer and the wait would time out.
TEST(BlockIndexSlices, ALookupOnAnotherThreadRunsBetweenSlices) {
  BlockIndex index;
  const size_t n = 4 * kSlice;
  const auto chain = tokens(0, n);
  std::mutex mu;
  std::condition_variable cv;
  bool asked = false, answered = false, stop = false;
  uint32_t answer = 0;
  std::thread reader([&] {
    std::unique_lock lock(mu);
    while (true) {
      cv.wait(lock, [&] { return asked || stop; });
      if (stop) return;
      asked = false;
      lock.unlock();
      const uint32_t m = matched(index, "n1", chain);
      lock.lock();
      answer = m;
      answered = true;
      cv.notify_all();
    }
  });
  std::vector<uint32_t> answers;
  size_t timeouts = 0;
  index.set_slice_hook_for_testing([&] {
    std::unique_lock lock(mu);
    asked = true;
    answered = false;
    cv.notify_all();
    if (cv.wait_for(lock, test::scaled(std::chrono::seconds(10)), [&] { return answered; })) {
      answers.push_back(answer);
    } else {
      ++timeouts;
    }
  });
  index.apply("n1", 0, batch({stored(0, chain)}));
  {
    std::lock_guard lock(mu);
    stop = true;
    cv.notify_all();
  }
  reader.join();
  EXPECT_EQ(timeouts, 0u);
  ASSERT_GE(answers.size(), 4u);
  EXPECT_LT(answers.front(), n);  // answered while the batch was still being applied
  EXPECT_EQ(answers.back(), n);
}

// A dropped node disappears from lookups and from its stats in the first, short hold, before
// any of its entries is erased; they then go in slices (other threads get the lock between
// them), and its slot is free for the next holder once they are all gone.
TEST(BlockIndexSlices, ADroppedNodeVanishesAtOnceAndIsErasedInSlices) {
  BlockIndex index;
  const size_t n = 3 * kSlice;
  const auto chain = tokens(0, n);
  index.apply("n1", 0, batch({stored(0, chain)}));
  index.apply("n1", 1, batch({stored(0, tokens(0, 10))}));
  index.apply("n2", 0, batch({stored(0, tokens(0, 10))}));
  const uint64_t before = index.stats().entries;
  ASSERT_EQ(before, n + 20);

  struct Seen {
    uint32_t matched;
    uint64_t node_entries, entries;
  };
  std::vector<Seen> seen;
  index.set_slice_hook_for_testing(
      [&] { seen.push_back({matched(index, "n1", chain), index.node_stats("n1").entries, index.stats().entries}); });
  index.drop_node("n1");

  ASSERT_GE(seen.size(), 4u);  // the detach, then at least three slices of erasing
  EXPECT_EQ(seen.front().entries, before) << "hidden before anything was erased";
  for (const Seen& s : seen) {
    EXPECT_EQ(s.matched, 0u);
    EXPECT_EQ(s.node_entries, 0u);
  }
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_LE(seen[i].entries, seen[i - 1].entries);
  EXPECT_EQ(index.stats().entries, 10u);
  EXPECT_EQ(matched(index, "n2", tokens(0, 10)), 10u);
  EXPECT_EQ(index.holder_slots(), 3u);
  index.set_slice_hook_for_testing(nullptr);
  // Both of n1's slots are free again: two new holders take them.
  index.apply("n3", 0, batch({stored(0, tokens(0, 2))}));
  index.apply("n1", 0, batch({stored(0, tokens(7, 2))}));
  EXPECT_EQ(index.holder_slots(), 3u);
  EXPECT_EQ(matched(index, "n1", tokens(7, 2)), 2u);
}

// AllBlocksCleared of a big holder, then new stores, in one batch: the clear goes in slices and
// the stores after it land after it.
TEST(BlockIndexSlices, ABigClearThenStoresInOneBatch) {
  BlockIndex index;
  const size_t n = 2 * kSlice + 5;
  index.apply("n1", 0, batch({stored(0, tokens(0, n))}));
  size_t holds = 0;
  index.set_slice_hook_for_testing([&] { ++holds; });
  index.apply("n1", 0, batch({cleared(), stored(900'000, tokens(50, 3))}));
  EXPECT_GE(holds, 3u);
  EXPECT_EQ(index.stats().entries, 3u);
  EXPECT_EQ(matched(index, "n1", tokens(0, n)), 0u);
  EXPECT_EQ(matched(index, "n1", tokens(50, 3)), 3u);
  EXPECT_EQ(index.stats().blocks_removed, n);
}

// The memory budget holds at every lock release, not just at the end of a batch, and evicts the
// least recently stored first.
TEST(BlockIndexSlices, TheBudgetHoldsBetweenSlices) {
  constexpr size_t kBudget = 1000;
  BlockIndex index(kBudget);
  const size_t n = 3 * kSlice;
  uint64_t most = 0;
  index.set_slice_hook_for_testing([&] { most = std::max(most, index.stats().entries); });
  index.apply("n1", 0, batch({stored(0, tokens(0, n))}));
  EXPECT_LE(most, kBudget);
  EXPECT_EQ(index.stats().entries, kBudget);
  EXPECT_EQ(index.stats().blocks_evicted, n - kBudget);
  // The newest kBudget blocks are left: the chain from block n - kBudget on, after its parent.
  KvEvent next = stored(10'000'000, tokens(5'000'000, 1), /*parent=*/n);
  index.apply("n1", 0, batch({next}));
  EXPECT_EQ(index.stats().blocks_skipped, 0u) << "the last block stored is still held";
  KvEvent gone = stored(20'000'000, tokens(6'000'000, 1), /*parent=*/n - kBudget);
  index.apply("n1", 0, batch({gone}));
  EXPECT_EQ(index.stats().blocks_skipped, 1u) << "the newest evicted block is gone";
}

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Engine hashes that are multiples of each of libstdc++'s bucket counts in turn (read from a
// growing std::unordered_map), as many as the table grows by at that count: in a table keyed by
// the plain value every one of them lands in bucket 0 and each insert walks them all. Keyed,
// they cost what as many random hashes cost (CPU time of this thread, so a loaded machine does
// not decide the outcome; a table keyed by the plain value takes over 20 times as long).
TEST(BlockIndexSlices, CraftedEngineHashesCostWhatRandomOnesCost) {
  constexpr size_t kUpTo = 42043;
  std::vector<size_t> counts;
  {
    std::unordered_map<uint64_t, char> probe;
    for (uint64_t i = 0; counts.empty() || counts.back() < kUpTo; ++i) {
      probe.emplace(i, 0);
      if (counts.empty() || probe.bucket_count() != counts.back()) counts.push_back(probe.bucket_count());
    }
  }
  KvEvent crafted;
  crafted.kind = KvEventKind::kBlockStored;
  crafted.block_size = 1;
  size_t previous = 0;
  for (const size_t buckets : counts) {
    for (size_t i = 1; i <= buckets - previous; ++i) crafted.block_hashes.push_back(i * buckets);
    previous = buckets;
  }
  crafted.token_ids.assign(crafted.block_hashes.size(), 7);
  KvEvent random = crafted;
  std::mt19937_64 rng(1);
  for (auto& h : random.block_hashes) h = rng();

  const auto cpu_to_apply = [](const KvEvent& e) {
    BlockIndex index;
    const double start = thread_cpu_seconds();
    index.apply("n1", 0, batch({e}));
    const double spent = thread_cpu_seconds() - start;
    EXPECT_EQ(index.stats().entries, e.block_hashes.size());
    return spent;
  };
  const double random_cpu = cpu_to_apply(random);
  const double crafted_cpu = cpu_to_apply(crafted);
  EXPECT_LT(crafted_cpu, 3 * random_cpu + 0.05 * test::time_scale())
      << crafted.block_hashes.size() << " blocks: crafted " << crafted_cpu << " s, random " << random_cpu << " s";
}

}  // namespace
}  // namespace pdr::router::cache
