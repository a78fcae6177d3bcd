// A latency histogram for /metrics: fixed buckets from 0.5 ms to 300 s, recorded by any thread
// with relaxed atomics (record() = find the bucket + two relaxed adds), read at scrape time.
//
// Buckets follow Prometheus `le`: a value equal to a bound goes in that bound's bucket. Durations
// are kept in integer nanoseconds, so the bounds are exact and the sum has no rounding drift.
// A snapshot reads each atomic on its own: a scrape racing a record() may see the bucket without
// the sum (or the reverse); _count is derived from the buckets, so `+Inf` == `_count` always.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace pdr {

class LatencyHistogram {
 public:
  // Upper bounds in seconds (the `le` values), +Inf not included.
  static constexpr size_t kBounds = 18;
  static constexpr std::array<double, kBounds> kBoundSeconds{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                             0.05,   0.1,   0.25,   0.5,   1,    2.5,
                                                             5,      10,    30,     60,    120,  300};

  // The same bounds in nanoseconds, as record() compares them (tests check both agree).
  static constexpr std::array<int64_t, kBounds> kBoundNanos{
      500'000,       1'000'000,      2'500'000,      5'000'000,       10'000'000,      25'000'000,
      50'000'000,    100'000'000,    250'000'000,    500'000'000,     1'000'000'000,   2'500'000'000,
      5'000'000'000, 10'000'000'000, 30'000'000'000, 60'000'000'000,  120'000'000'000, 300'000'000'000};

  struct Snapshot {
    std::array<uint64_t, kBounds> cumulative{};  // observations <= kBoundSeconds[i]
    uint64_t count = 0;                          // all observations (the +Inf bucket)
    double sum_seconds = 0;
  };

  // A negative duration (a clock that went backwards cannot, steady_clock; a caller bug could)
  // counts as 0.
  void record(std::chrono::nanoseconds elapsed) {
    const int64_t ns = elapsed.count() < 0 ? 0 : elapsed.count();
    size_t i = 0;
    while (i < kBounds && ns > kBoundNanos[i]) ++i;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    sum_nanos_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
  }

  Snapshot snapshot() const {
    Snapshot out;
    uint64_t running = 0;
    for (size_t i = 0; i < kBounds; ++i) {
      running += buckets_[i].load(std::memory_order_relaxed);
      out.cumulative[i] = running;
    }
    out.count = running + buckets_[kBounds].load(std::memory_order_relaxed);
    out.sum_seconds = static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) / 1e9;
    return out;
  }

 private:
  std::array<std::atomic<uint64_t>, kBounds + 1> buckets_{};  // not cumulative; last: above every bound
  std::atomic<uint64_t> sum_nanos_{0};
};

}  // namespace pdr
