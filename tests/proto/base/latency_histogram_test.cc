// LatencyHistogram: Prometheus `le` bucket edges (a value equal to a bound is in that bucket),
// cumulative snapshots, the +Inf bucket, and the sum.
#include "proto/base/latency_histogram.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

namespace pdr {
namespace {

using std::chrono::nanoseconds;

TEST(LatencyHistogram, NanosecondBoundsAreTheSecondBounds) {
  for (size_t i = 0; i < LatencyHistogram::kBounds; ++i) {
    EXPECT_EQ(LatencyHistogram::kBoundNanos[i], std::llround(LatencyHistogram::kBoundSeconds[i] * 1e9)) << i;
    if (i > 0) {
      EXPECT_LT(LatencyHistogram::kBoundSeconds[i - 1], LatencyHistogram::kBoundSeconds[i]) << i;
    }
  }
  EXPECT_DOUBLE_EQ(LatencyHistogram::kBoundSeconds.front(), 0.0005);
  EXPECT_DOUBLE_EQ(LatencyHistogram::kBoundSeconds.back(), 300);
}

TEST(LatencyHistogram, EmptySnapshotIsAllZero) {
  LatencyHistogram h;
  const auto s = h.snapshot();
  EXPECT_EQ(s.count, 0u);
  EXPECT_EQ(s.sum_seconds, 0.0);
  for (uint64_t c : s.cumulative) EXPECT_EQ(c, 0u);
}

TEST(LatencyHistogram, AValueEqualToABoundIsInThatBucket) {
  for (size_t i = 0; i < LatencyHistogram::kBounds; ++i) {
    LatencyHistogram h;
    h.record(nanoseconds(LatencyHistogram::kBoundNanos[i]));
    const auto s = h.snapshot();
    for (size_t j = 0; j < LatencyHistogram::kBounds; ++j) EXPECT_EQ(s.cumulative[j], j >= i ? 1u : 0u) << i << " " << j;
    EXPECT_EQ(s.count, 1u);
  }
}

TEST(LatencyHistogram, OneNanosecondAboveABoundIsInTheNextBucket) {
  for (size_t i = 0; i < LatencyHistogram::kBounds; ++i) {
    LatencyHistogram h;
    h.record(nanoseconds(LatencyHistogram::kBoundNanos[i] + 1));
    const auto s = h.snapshot();
    for (size_t j = 0; j < LatencyHistogram::kBounds; ++j) EXPECT_EQ(s.cumulative[j], j > i ? 1u : 0u) << i << " " << j;
    EXPECT_EQ(s.count, 1u);  // above 300 s: only in +Inf
  }
}

TEST(LatencyHistogram, CumulativeCountsSumAndInf) {
  LatencyHistogram h;
  h.record(nanoseconds(0));            // le 0.0005
  h.record(std::chrono::microseconds(700));  // le 0.001
  h.record(std::chrono::milliseconds(3));    // le 0.005
  h.record(std::chrono::seconds(2));         // le 2.5
  h.record(std::chrono::seconds(400));       // +Inf only
  h.record(nanoseconds(-5));                 // counts as 0
  const auto s = h.snapshot();
  EXPECT_EQ(s.cumulative[0], 2u);   // 0.0005
  EXPECT_EQ(s.cumulative[1], 3u);   // 0.001
  EXPECT_EQ(s.cumulative[2], 3u);   // 0.0025
  EXPECT_EQ(s.cumulative[3], 4u);   // 0.005
  EXPECT_EQ(s.cumulative[10], 4u);  // 1
  EXPECT_EQ(s.cumulative[11], 5u);  // 2.5
  EXPECT_EQ(s.cumulative[17], 5u);  // 300
  EXPECT_EQ(s.count, 6u);
  EXPECT_NEAR(s.sum_seconds, 0.0007 + 0.003 + 2 + 400, 1e-9);
  for (size_t j = 1; j < LatencyHistogram::kBounds; ++j) EXPECT_LE(s.cumulative[j - 1], s.cumulative[j]);
}

}  // namespace
}  // namespace pdr
