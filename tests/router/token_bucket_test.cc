#include "router/clients/token_bucket.h"

#include <gtest/gtest.h>

#include <cmath>

namespace pdr::router::clients {
namespace {

using namespace std::chrono_literals;
using Clock = TokenBucket::Clock;

TEST(TokenBucket, StartsFullThenRefillsAtItsRate) {
  const Clock::time_point t0{};
  TokenBucket b(2, 4, t0);  // 2 at once, 4 a second
  double wait = -1;
  EXPECT_TRUE(b.try_take(1, t0, &wait));
  EXPECT_TRUE(b.try_take(1, t0, &wait));
  EXPECT_FALSE(b.try_take(1, t0, &wait));
  EXPECT_DOUBLE_EQ(wait, 0.25);  // one token at 4 a second
  EXPECT_FALSE(b.try_take(1, t0 + 200ms, &wait));
  EXPECT_NEAR(wait, 0.05, 1e-9);
  EXPECT_TRUE(b.try_take(1, t0 + 250ms, &wait));
  // Never above capacity, however long it waits.
  EXPECT_DOUBLE_EQ(b.tokens(t0 + 1h), 2);
}

TEST(TokenBucket, AllOrNothing) {
  const Clock::time_point t0{};
  TokenBucket b(100, 10, t0);
  double wait = 0;
  EXPECT_TRUE(b.try_take(70, t0, &wait));
  EXPECT_FALSE(b.try_take(40, t0, &wait));  // 30 left: none taken
  EXPECT_DOUBLE_EQ(b.tokens(t0), 30);
  EXPECT_DOUBLE_EQ(wait, 1.0);
  EXPECT_FALSE(b.try_take(101, t0 + 1h, &wait));
  EXPECT_TRUE(std::isinf(wait));  // more than it can ever hold
  EXPECT_EQ(TokenBucket::retry_after_seconds(wait), 0);
}

TEST(TokenBucket, ChargeMayOweAndPutBackIsCapped) {
  const Clock::time_point t0{};
  TokenBucket b(60, 1, t0);
  b.charge(90, t0);
  EXPECT_DOUBLE_EQ(b.tokens(t0), -30);
  double wait = 0;
  EXPECT_FALSE(b.try_take(10, t0 + 30s, &wait));  // the debt is paid first
  EXPECT_DOUBLE_EQ(wait, 10);
  b.put_back(500, t0 + 30s);
  EXPECT_DOUBLE_EQ(b.tokens(t0 + 30s), 60);
}

TEST(TokenBucket, ReconfigureKeepsWhatItHolds) {
  const Clock::time_point t0{};
  TokenBucket b(10, 1, t0);
  double wait = 0;
  ASSERT_TRUE(b.try_take(4, t0, &wait));
  b.reconfigure(20, 2, t0);
  EXPECT_DOUBLE_EQ(b.tokens(t0), 6);
  b.reconfigure(3, 2, t0);
  EXPECT_DOUBLE_EQ(b.tokens(t0), 3);
  EXPECT_DOUBLE_EQ(b.tokens(t0 + 10s), 3);
}

TEST(TokenBucket, RetryAfterRoundsUpToWholeSeconds) {
  EXPECT_EQ(TokenBucket::retry_after_seconds(0.0), 1);
  EXPECT_EQ(TokenBucket::retry_after_seconds(0.2), 1);
  EXPECT_EQ(TokenBucket::retry_after_seconds(1.0), 1);
  EXPECT_EQ(TokenBucket::retry_after_seconds(1.01), 2);
  EXPECT_EQ(TokenBucket::retry_after_seconds(59.5), 60);
}

}  // namespace
}  // namespace pdr::router::clients
