// block_index_bench: the KV block index (router/cache/block_index.h) under the loads a node can
// put on it. One run measures
//   1. heap bytes per (holder, block) entry: glibc's mallinfo2() in-use bytes (malloc's chunk
//      headers and rounding included) and the RSS growth, after filling N entries from chained
//      16-token BlockStored events with random engine hashes; once with every block held by one
//      node, once with every block held by two nodes (shared prefixes share the router-hash side);
//   2. crafted engine hashes: for each of libstdc++'s bucket counts up to a limit, as many
//      multiples of it as the table grows by while it has that many buckets (every one of them in
//      bucket 0 of a table keyed by the plain value), in 64k-block batches;
//   3. dropping a node holding N entries.
// During 2 and 3 (and the fill of 1) a reader thread runs longest_prefix in a loop, as the HTTP
// workers do, and the longest single lookup is reported: how long routing can stall behind the
// writer. `--smoke` runs tiny sizes (CTest) and fails only if the index ends in a wrong state.
// Method, machine and figures: bench/router/BLOCK_INDEX_RESULTS.md.
#include <malloc.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "router/cache/block_index.h"

namespace {

using pdr::proto::KvEvent;
using pdr::proto::KvEventBatch;
using pdr::proto::KvEventKind;
using pdr::router::cache::BlockIndex;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kBlockSize = 16;
constexpr size_t kBlocksPerEvent = 32;  // a 512-token prompt per event

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// CPU time of the calling thread: what the writer spends, whatever else loads the machine.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The writer's CPU time per exclusive-lock hold, from the index's slice hook (called on the
// writing thread after each hold): the longest hold, in CPU time, and the number of holds.
class SliceTimer {
 public:
  explicit SliceTimer(BlockIndex& index) {
    index.set_slice_hook_for_testing([this] {
      const double now = thread_cpu_seconds();
      longest = std::max(longest, now - last);
      last = now;
      ++holds;
    });
  }
  void start() { last = thread_cpu_seconds(); }
  double last = 0, longest = 0;
  uint64_t holds = 0;
};

size_t heap_in_use() { return mallinfo2().uordblks + mallinfo2().hblkhd; }

size_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// Looks up a fixed prompt in a loop until stopped; keeps the longest lookup.
class Reader {
 public:
  explicit Reader(const BlockIndex& index) : index_(index) {
    for (uint32_t i = 0; i < 4 * kBlockSize; ++i) prompt_.push_back(i);
    thread_ = std::thread([this] { run(); });
  }
  // Stops the thread; returns {longest lookup in seconds, lookups done}.
  std::pair<double, uint64_t> stop() {
    stop_ = true;
    thread_.join();
    return {longest_, lookups_};
  }

 private:
  void run() {
    while (!stop_) {
      const auto t = Clock::now();
      auto matches = index_.longest_prefix(prompt_);
      longest_ = std::max(longest_, seconds_since(t));
      ++lookups_;
      if (matches.size() > 1000) std::abort();  // keeps the call from being optimised away
    }
  }
  const BlockIndex& index_;
  std::vector<uint32_t> prompt_;
  std::atomic<bool> stop_{false};
  double longest_ = 0;
  uint64_t lookups_ = 0;
  std::thread thread_;
};

// Chained BlockStored events holding `entries` blocks in all, with random engine hashes.
std::vector<KvEventBatch> random_batches(size_t entries, std::mt19937_64& rng) {
  std::vector<KvEventBatch> out;
  KvEventBatch batch;
  for (size_t done = 0; done < entries;) {
    KvEvent e;
    e.kind = KvEventKind::kBlockStored;
    e.block_size = kBlockSize;
    const size_t n = std::min(kBlocksPerEvent, entries - done);
    for (size_t i = 0; i < n; ++i) {
      e.block_hashes.push_back(rng());
      for (uint32_t t = 0; t < kBlockSize; ++t) e.token_ids.push_back(static_cast<uint32_t>(rng() % 50000));
    }
    done += n;
    batch.events.push_back(std::move(e));
    if (batch.events.size() == 256) out.push_back(std::move(batch)), batch = {};
  }
  if (!batch.events.empty()) out.push_back(std::move(batch));
  return out;
}

// libstdc++'s bucket counts for a growing std::unordered_map, read from one.
std::vector<size_t> bucket_counts(size_t up_to) {
  std::unordered_map<uint64_t, char> m;
  std::vector<size_t> out;
  for (uint64_t i = 0; out.empty() || out.back() < up_to; ++i) {
    m.emplace(i, 0);
    if (out.empty() || m.bucket_count() != out.back()) out.push_back(m.bucket_count());
  }
  return out;
}

struct Config {
  bool smoke = false;
  size_t entries = 1'000'000;
  size_t crafted_up_to = 172'933;
};

bool memory_per_entry(const Config& c, int holders) {
  std::mt19937_64 rng(42 + holders);
  const auto batches = random_batches(c.entries, rng);
  BlockIndex index(c.entries * static_cast<size_t>(holders) + 1);
  SliceTimer slices(index);
  const size_t heap0 = heap_in_use(), rss0 = rss_bytes();
  Reader reader(index);
  const double cpu0 = thread_cpu_seconds();
  slices.start();
  for (int h = 0; h < holders; ++h) {
    for (const auto& b : batches) index.apply("127.0.0.1:" + std::to_string(8100 + h), 0, b);
  }
  const double cpu = thread_cpu_seconds() - cpu0;
  const auto [longest, lookups] = reader.stop();
  const uint64_t entries = index.stats().entries;
  const double heap = static_cast<double>(heap_in_use() - heap0) / static_cast<double>(entries);
  const double rss = static_cast<double>(rss_bytes() - rss0) / static_cast<double>(entries);
  std::printf("fill: %" PRIu64 " entries, every block on %d node(s): %.1f heap bytes/entry, %.1f RSS bytes/entry; "
              "writer %.2f us CPU/block, longest hold %.2f ms CPU (%" PRIu64 " holds); "
              "longest lookup %.2f ms wall (%" PRIu64 " lookups)\n",
              entries, holders, heap, rss, cpu * 1e6 / static_cast<double>(entries), slices.longest * 1e3,
              slices.holds, longest * 1e3, lookups);
  return entries == c.entries * static_cast<size_t>(holders);
}

bool crafted(const Config& c) {
  const auto counts = bucket_counts(c.crafted_up_to);
  std::vector<KvEventBatch> batches;
  size_t previous = 0, total = 0;
  uint64_t parent = 0;
  for (const size_t buckets : counts) {
    if (buckets > c.crafted_up_to) break;
    const size_t n = buckets - previous;
    previous = buckets;
    for (size_t first = 1; first <= n; first += 65536) {
      KvEvent e;
      e.kind = KvEventKind::kBlockStored;
      e.block_size = 4;
      if (parent != 0) e.parent_block_hash = parent;
      for (size_t i = first; i <= std::min(n, first + 65535); ++i) {
        e.block_hashes.push_back(i * buckets);
        for (uint32_t t = 0; t < 4; ++t) e.token_ids.push_back(static_cast<uint32_t>(i + t));
      }
      parent = e.block_hashes.back();
      total += e.block_hashes.size();
      KvEventBatch b;
      b.events.push_back(std::move(e));
      batches.push_back(std::move(b));
    }
  }
  BlockIndex index;
  SliceTimer slices(index);
  Reader reader(index);
  const double cpu0 = thread_cpu_seconds();
  slices.start();
  for (const auto& b : batches) index.apply("127.0.0.1:8100", 0, b);
  const double cpu = thread_cpu_seconds() - cpu0;
  const auto [longest, lookups] = reader.stop();
  std::printf("crafted hashes: %zu blocks (multiples of each bucket count up to %zu): writer %.3f s CPU, "
              "longest hold %.2f ms CPU (%" PRIu64 " holds); longest lookup %.2f ms wall (%" PRIu64 " lookups)\n",
              total, c.crafted_up_to, cpu, slices.longest * 1e3, slices.holds, longest * 1e3, lookups);
  return index.stats().entries == total;
}

bool drop(const Config& c) {
  std::mt19937_64 rng(7);
  const auto batches = random_batches(c.entries, rng);
  BlockIndex index(c.entries + 1);
  for (const auto& b : batches) index.apply("127.0.0.1:8100", 0, b);
  index.apply("127.0.0.1:8200", 0, batches.front());
  SliceTimer slices(index);
  Reader reader(index);
  const double cpu0 = thread_cpu_seconds();
  slices.start();
  index.drop_node("127.0.0.1:8100");
  const double cpu = thread_cpu_seconds() - cpu0;
  const auto [longest, lookups] = reader.stop();
  std::printf("drop: a node of %zu entries: writer %.3f s CPU, longest hold %.2f ms CPU (%" PRIu64 " holds); "
              "longest lookup %.2f ms wall (%" PRIu64 " lookups)\n",
              c.entries, cpu, slices.longest * 1e3, slices.holds, longest * 1e3, lookups);
  return index.stats().entries == batches.front().events.size() * kBlocksPerEvent;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--smoke") {
      c.smoke = true;
      c.entries = 20'000;
      c.crafted_up_to = 10'273;
    } else if (arg == "--entries" && i + 1 < argc) {
      c.entries = std::strtoull(argv[++i], nullptr, 10);
    } else if (arg == "--crafted-up-to" && i + 1 < argc) {
      c.crafted_up_to = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--smoke] [--entries N] [--crafted-up-to BUCKETS]\n", argv[0]);
      return 2;
    }
  }
  std::printf("block_index_bench%s: nproc %ld\n", c.smoke ? " (smoke)" : "", sysconf(_SC_NPROCESSORS_ONLN));
  bool ok = memory_per_entry(c, 1);
  ok = memory_per_entry(c, 2) && ok;
  ok = crafted(c) && ok;
  ok = drop(c) && ok;
  if (!ok) std::fprintf(stderr, "block_index_bench: the index ended in a wrong state\n");
  return ok ? 0 : 1;
}
