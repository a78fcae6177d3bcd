#include "router/policies/cache_aware.h"

#include <gtest/gtest.h>

#include <vector>

namespace pdr::router {
namespace {

std::vector<Candidate> nodes(std::vector<uint32_t> outstanding) {
  static const char* keys[] = {"127.0.0.1:8100", "127.0.0.1:8200", "127.0.0.1:8300", "127.0.0.1:8400"};
  std::vector<Candidate> out;
  for (size_t i = 0; i < outstanding.size(); ++i) out.push_back({keys[i], outstanding[i], 1});
  return out;
}

TEST(CacheAware, TheNodeHoldingMostOfThePromptWins) {
  const auto c = nodes({5, 0, 0});
  const std::vector<uint32_t> cached{960, 64, 0};
  EXPECT_EQ(pick_by_cache(c, cached, 1000, {}), 0u);  // busier, but holds 96% of the prompt
}

TEST(CacheAware, TooLittleCachedLetsLoadDecide) {
  const auto c = nodes({0, 0});
  EXPECT_EQ(pick_by_cache(c, std::vector<uint32_t>{300, 0}, 1000, {}), std::nullopt);  // 30% < 50%
  EXPECT_EQ(pick_by_cache(c, std::vector<uint32_t>{0, 0}, 1000, {}), std::nullopt);
  EXPECT_EQ(pick_by_cache(c, std::vector<uint32_t>{0, 0}, 0, {}), std::nullopt);
}

TEST(CacheAware, AnOverloadedBestMatchYieldsToLoad) {
  CacheAwareRule rule;
  rule.balance_abs_threshold = 8;
  rule.balance_rel_threshold = 2.0;
  const std::vector<uint32_t> cached{1000, 0};
  // 20 vs 2: 18 more and 10x: affinity dropped.
  EXPECT_EQ(pick_by_cache(nodes({20, 2}), cached, 1000, rule), std::nullopt);
  // 12 vs 8: only 4 more: kept.
  EXPECT_EQ(pick_by_cache(nodes({12, 8}), cached, 1000, rule), 0u);
  // 40 vs 30: 10 more but only 1.33x: kept (both thresholds must be crossed).
  EXPECT_EQ(pick_by_cache(nodes({40, 30}), cached, 1000, rule), 0u);
}

TEST(CacheAware, WeightsScaleTheLoad) {
  CacheAwareRule rule;
  rule.balance_abs_threshold = 8;
  rule.balance_rel_threshold = 2.0;
  auto c = nodes({40, 2});
  c[0].weight = 8;  // 40 requests over 8 DP ranks: 5 per rank, not overloaded
  EXPECT_EQ(pick_by_cache(c, std::vector<uint32_t>{1000, 0}, 1000, rule), 0u);
}

TEST(CacheAware, EqualMatchesGoToTheLessLoaded) {
  EXPECT_EQ(pick_by_cache(nodes({3, 1, 2}), std::vector<uint32_t>{800, 800, 800}, 1000, {}), 1u);
}

}  // namespace
}  // namespace pdr::router
