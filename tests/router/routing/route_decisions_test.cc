#include "router/routing/route_decisions.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

#include "proto/base/metrics_writer.h"

namespace pdr::router::routing {
namespace {

RouteDecision decision(int i, bool cache_best_chosen) {
  RouteDecision d;
  d.request_id = "req-" + std::to_string(i);
  LegExplanation& p = d.explanation.prefill;
  p.filled = true;
  p.rows.push_back({"127.0.40.1:8000", 0, 1, {}, 10, 0.01, 0.01, false});
  p.rows.push_back({"127.0.40.2:8000", 3, 1, {}, 2, 0.5, 0.5, false});
  p.chosen = cache_best_chosen ? 1 : 0;
  p.cache_best = 1;
  return d;
}

TEST(RouteDecisions, KeepsTheLastDecisionsNewestFirst) {
  RouteDecisionLog log;
  for (int i = 0; i < 300; ++i) log.record(decision(i, i % 2 == 0));
  const http::Response r = log.render("");
  ASSERT_EQ(r.status, 200);
  const auto doc = nlohmann::json::parse(r.body);
  EXPECT_EQ(doc["capacity"], kRouteDecisions);
  EXPECT_EQ(doc["recorded"], 300);
  ASSERT_EQ(doc["decisions"].size(), kRouteDecisions);
  EXPECT_EQ(doc["decisions"][0]["request_id"], "req-299");
  EXPECT_EQ(doc["decisions"][kRouteDecisions - 1]["request_id"], "req-44");
  EXPECT_TRUE(doc["decisions"][0]["decode"].is_null());
  const auto& prefill = doc["decisions"][0]["prefill"];
  EXPECT_EQ(prefill["chosen"], "127.0.40.1:8000");
  EXPECT_EQ(prefill["cache_best"], "127.0.40.2:8000");
  EXPECT_NE(prefill["reason"].get<std::string>().find("skipped for load"), std::string::npos);
  EXPECT_EQ(prefill["candidates"].size(), 2u);
  const auto limited = nlohmann::json::parse(log.render("limit=3").body);
  EXPECT_EQ(limited["decisions"].size(), 3u);
  EXPECT_EQ(log.counters().cache_best_chosen.load(), 150u);
  EXPECT_EQ(log.counters().cache_best_skipped.load(), 150u);
}

// A session's or conversation's node is not the policy's choice: the reason says so and the
// cache-best counters (how the policy treated the node holding the prompt) leave it out.
TEST(RouteDecisions, APreferredNodeIsNotCountedAsThePolicysChoice) {
  RouteDecisionLog log;
  RouteDecision d = decision(1, false);
  d.explanation.prefill.preferred = true;
  log.record(std::move(d));
  const auto doc = nlohmann::json::parse(log.render("").body);
  const auto& prefill = doc["decisions"][0]["prefill"];
  EXPECT_TRUE(prefill["preferred"].get<bool>());
  EXPECT_NE(prefill["reason"].get<std::string>().find("session's or conversation's node"), std::string::npos);
  EXPECT_EQ(log.counters().cache_best_chosen.load(), 0u);
  EXPECT_EQ(log.counters().cache_best_skipped.load(), 0u);
}

TEST(RouteDecisions, RefusesABadLimit) {
  RouteDecisionLog log;
  for (const char* bad : {"limit=0", "limit=257", "limit=", "limit=1x", "limit=-1", "x=1", "limit=1&limit=2"}) {
    const http::Response r = log.render(bad);
    EXPECT_EQ(r.status, 400) << bad;
    EXPECT_NE(r.body.find("bad_limit"), std::string::npos) << bad;
  }
}

TEST(RouteDecisions, PredictionErrorHistogram) {
  RouteDecisionLog log;
  log.observe_ttft(0.100, 0.102);  // 2 ms
  log.observe_ttft(0.100, 0.300);  // 200 ms
  log.observe_ttft(1.0, 100.0);    // past every bound
  MetricsWriter out;
  log.write_metrics(out);
  const std::string text = out.text();
  EXPECT_NE(text.find("pdrouter_routing_ttft_prediction_error_seconds_bucket{le=\"0.005\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("pdrouter_routing_ttft_prediction_error_seconds_bucket{le=\"0.25\"} 2"), std::string::npos);
  EXPECT_NE(text.find("pdrouter_routing_ttft_prediction_error_seconds_count 3"), std::string::npos);
  EXPECT_NE(text.find("pdrouter_routing_cache_best_total{outcome=\"skipped_for_load\"} 0"), std::string::npos);
}

}  // namespace
}  // namespace pdr::router::routing
