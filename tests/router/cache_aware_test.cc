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

// ---- the cache_aware policy (make_policy) ---------------------------------------------------

config::Topology::Policies cache_aware_config() {
  config::Topology::Policies p;
  p.cache_aware.min_match_percent = 50;
  p.cache_aware.balance_abs_threshold = 8;
  p.cache_aware.balance_rel_percent = 200;
  return p;
}

RequestSummary with(const CacheHits& hits) {
  RequestSummary s;
  s.cache = &hits;
  return s;
}

TEST(CacheAwarePolicy, PicksTheNodeHoldingThePromptByKey) {
  auto policy = make_policy(config::PolicyName::kCacheAware, 1, cache_aware_config());
  EXPECT_EQ(policy->name(), config::PolicyName::kCacheAware);
  const auto c = nodes({3, 0, 1});
  CacheHits hits;
  hits.prompt_units = 100;
  hits.nodes = {{"127.0.0.1:8300", 90}, {"127.0.0.1:8100", 20}, {"127.0.0.1:9999", 100}};  // 9999: not a candidate
  EXPECT_EQ(policy->pick(c, with(hits)), 2u);
  EXPECT_EQ(hits.matched("127.0.0.1:8200"), 0u);
}

TEST(CacheAwarePolicy, WithoutUsefulCacheItPicksTheLeastLoaded) {
  auto policy = make_policy(config::PolicyName::kCacheAware, 1, cache_aware_config());
  const auto c = nodes({3, 0, 1});
  EXPECT_EQ(policy->pick(c, RequestSummary{}), 1u);  // no lookup at all
  CacheHits hits;
  hits.prompt_units = 100;
  EXPECT_EQ(policy->pick(c, with(hits)), 1u);  // nobody holds any of it
  hits.nodes = {{"127.0.0.1:8100", 40}};        // 40% < min_match_percent
  EXPECT_EQ(policy->pick(c, with(hits)), 1u);
  hits.nodes = {{"127.0.0.1:8100", 60}};
  EXPECT_EQ(policy->pick(c, with(hits)), 0u);
  // Overloaded: 20 vs 0 is more than 8 beyond and more than 200% of the least loaded.
  EXPECT_EQ(policy->pick(nodes({20, 0, 1}), with(hits)), 1u);
}

}  // namespace
}  // namespace pdr::router
