// KvEventsRateLimit: a second's worth of batches and bytes, refilled continuously.
#include "router/cache/kv_events_rate_limit.h"

#include <gtest/gtest.h>

namespace pdr::router::cache {
namespace {

using namespace std::chrono_literals;
using Clock = KvEventsRateLimit::Clock;

TEST(KvEventsRateLimit, ASecondOfBatchesThenTheRefill) {
  const auto t0 = Clock::time_point{} + 1h;
  KvEventsRateLimit limit(10, 1 << 20, t0);
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(limit.admit(1, t0)) << i;  // starts full
  EXPECT_FALSE(limit.admit(1, t0));
  EXPECT_FALSE(limit.admit(1, t0 + 50ms)) << "half a batch refilled";
  EXPECT_TRUE(limit.admit(1, t0 + 100ms)) << "one batch refilled";
  EXPECT_FALSE(limit.admit(1, t0 + 100ms));
  // A long quiet spell refills to one second's worth, no more.
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(limit.admit(1, t0 + 1h)) << i;
  EXPECT_FALSE(limit.admit(1, t0 + 1h));
}

TEST(KvEventsRateLimit, BytesBound) {
  const auto t0 = Clock::time_point{} + 1h;
  KvEventsRateLimit limit(1000, 1000, t0);
  EXPECT_TRUE(limit.admit(600, t0));
  EXPECT_FALSE(limit.admit(600, t0)) << "400 bytes left";
  EXPECT_TRUE(limit.admit(400, t0)) << "a refused batch cost nothing";
  EXPECT_FALSE(limit.admit(1, t0));
  EXPECT_TRUE(limit.admit(500, t0 + 500ms));
  EXPECT_FALSE(limit.admit(1001, t0 + 1h)) << "more than a second's worth never fits";
  EXPECT_TRUE(limit.admit(1000, t0 + 1h));
}

TEST(KvEventsRateLimit, ZeroRatesActAsOne) {
  const auto t0 = Clock::time_point{} + 1h;
  KvEventsRateLimit limit(0, 0, t0);
  EXPECT_TRUE(limit.admit(1, t0));
  EXPECT_FALSE(limit.admit(1, t0));
  EXPECT_TRUE(limit.admit(0, t0 + 1s));
}

}  // namespace
}  // namespace pdr::router::cache
