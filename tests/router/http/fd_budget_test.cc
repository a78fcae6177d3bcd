// Sizing max_connections from RLIMIT_NOFILE.
#include "router/http/fd_budget.h"

#include <gtest/gtest.h>

namespace pdr::http {
namespace {

TEST(FdBudget, DefaultsFitALargeLimitUnchanged) {
  const FdBudget b = fit_fd_limit(1 << 20, 16384, 4096);
  EXPECT_FALSE(b.clamped);
  EXPECT_EQ(b.max_connections, 16384u);
  EXPECT_EQ(b.needed, 16384u + 2 * 4096u + kFdHeadroom);
}

TEST(FdBudget, DefaultsAgainstTheCommon1024LimitAreClamped) {
  // 16,384 connections and 4,096 requests with two legs each cannot fit in 1,024 descriptors.
  const FdBudget b = fit_fd_limit(1024, 16384, 4096);
  EXPECT_TRUE(b.clamped);
  EXPECT_EQ(b.needed, 16384u + 2 * 4096u + kFdHeadroom);
  // (1024 - 256) / 3: each connection may carry a request with two legs.
  EXPECT_EQ(b.max_connections, 256u);
}

TEST(FdBudget, FewRequestsLeaveRoomForIdleConnections) {
  // 20,000 fds, 100 requests in flight: 200 leg fds, the rest for connections.
  const FdBudget b = fit_fd_limit(20000, 30000, 100);
  EXPECT_TRUE(b.clamped);
  EXPECT_EQ(b.max_connections, 20000u - kFdHeadroom - 200u);
}

TEST(FdBudget, TinyLimitStillAllowsOneConnection) {
  EXPECT_EQ(fit_fd_limit(2, 100, 100).max_connections, 1u);
  EXPECT_FALSE(fit_fd_limit(0, 100, 100).clamped);  // unknown limit: unchanged
}

}  // namespace
}  // namespace pdr::http
