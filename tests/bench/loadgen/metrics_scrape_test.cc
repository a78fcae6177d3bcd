#include "bench/loadgen/metrics_scrape.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bench/loadgen/bench_report.h"

namespace pdr::loadgen {
namespace {

constexpr std::string_view kRouterBefore =
    "# HELP pdrouter_cache_routing_matched_units_total Prompt units\n"
    "# TYPE pdrouter_cache_routing_matched_units_total counter\n"
    "pdrouter_cache_routing_matched_units_total{leg=\"prefill\",source=\"kv_events\"} 100\n"
    "pdrouter_cache_routing_matched_units_total{leg=\"prefill\",source=\"prefix_tree\"} 0\n"
    "pdrouter_cache_routing_prompt_units_total{leg=\"prefill\",source=\"kv_events\"} 1000\n"
    "pdrouter_cache_routing_prompt_units_total{leg=\"prefill\",source=\"prefix_tree\"} 0\n"
    "pdrouter_cache_routing_prompt_units_total_other{leg=\"prefill\"} 7\n";
constexpr std::string_view kRouterAfter =
    "pdrouter_cache_routing_matched_units_total{leg=\"prefill\",source=\"kv_events\"} 700\r\n"
    "pdrouter_cache_routing_matched_units_total{source=\"prefix_tree\",leg=\"prefill\"} 0\n"
    "pdrouter_cache_routing_prompt_units_total{leg=\"prefill\",source=\"kv_events\"} 2000\n"
    "pdrouter_cache_routing_prompt_units_total{leg=\"prefill\",source=\"prefix_tree\"} 0\n"
    "pdrouter_cache_routing_prompt_units_total{leg=\"decode\",source=\"kv_events\"} 50 1712000000000\n"
    "pdrouter_cache_routing_matched_units_total{leg=\"decode\",source=\"kv_events\"} 5\n";

TEST(SumSamples, GroupsByLabelsAndSkipsWhatDoesNotParse) {
  const std::string page =
      "vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 30\n"
      "vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 12.5\n"
      "vllm:prefix_cache_hits_total_created{engine=\"0\"} 99\n"
      "vllm:prefix_cache_hits_total{engine=\"2\"} NaN\n"
      "vllm:prefix_cache_hits_total{engine=\"3\" 5\n"
      "vllm:prefix_cache_hits_total{engine=\"a\\\"b\"} 1\n"
      "vllm:prefix_cache_hits_total 2\n"
      "# vllm:prefix_cache_hits_total 1000\n";
  EXPECT_DOUBLE_EQ(sum_samples_by(page, "vllm:prefix_cache_hits_total", {}).at(""), 45.5);
  const auto by_engine = sum_samples_by(page, "vllm:prefix_cache_hits_total", {"engine"});
  EXPECT_DOUBLE_EQ(by_engine.at("0"), 30);
  EXPECT_DOUBLE_EQ(by_engine.at("a\"b"), 1);
  EXPECT_DOUBLE_EQ(by_engine.at(""), 2);
  EXPECT_EQ(by_engine.count("3"), 0u);
}

TEST(CacheRates, RouterDifferenceOverTheRun) {
  const CacheCounters before = router_cache_counters({std::string(kRouterBefore)});
  const CacheCounters after = router_cache_counters({std::string(kRouterAfter)});
  const auto rates = cache_rates(before, after);
  EXPECT_DOUBLE_EQ(rates.at("prefill/kv_events").matched, 600);
  EXPECT_DOUBLE_EQ(rates.at("prefill/kv_events").prompt, 1000);
  EXPECT_DOUBLE_EQ(*rates.at("prefill/kv_events").rate, 0.6);
  EXPECT_FALSE(rates.at("prefill/prefix_tree").rate.has_value());
  EXPECT_DOUBLE_EQ(*rates.at("decode/kv_events").rate, 0.1);
  // kv_events matched 600 of the 3,000 tokens the run sent (the rest had no lookup there).
  const RouterRate headline = router_headline_rate(rates, 3000);
  EXPECT_DOUBLE_EQ(*headline.rate.rate, 0.2);
  EXPECT_EQ(headline.source, "prefill/kv_events");
  // Only the prefix tree counted: its own ratio.
  CacheCounters tree;
  tree.prompt["prefill/prefix_tree"] = 400;
  tree.matched["prefill/prefix_tree"] = 100;
  const RouterRate bytes = router_headline_rate(cache_rates({}, tree), 3000);
  EXPECT_DOUBLE_EQ(*bytes.rate.rate, 0.25);
  EXPECT_EQ(bytes.source, "prefill/prefix_tree");
  // Two replicas' pages are summed.
  const CacheCounters both = router_cache_counters({std::string(kRouterAfter), std::string(kRouterAfter)});
  EXPECT_DOUBLE_EQ(both.prompt.at("prefill/kv_events"), 4000);
}

TEST(CacheRates, EnginesByPageAndTogether) {
  const std::vector<std::string> urls = {"http://127.0.0.1:1/metrics", "http://127.0.0.1:2/metrics"};
  const CacheCounters before = engine_cache_counters(
      urls, {"vllm:prefix_cache_queries_total{engine=\"0\"} 100\nvllm:prefix_cache_hits_total{engine=\"0\"} 10\n",
             "vllm:prefix_cache_queries_total 0\nvllm:prefix_cache_hits_total 0\n"});
  const CacheCounters after = engine_cache_counters(
      urls, {"vllm:prefix_cache_queries_total{engine=\"0\"} 300\nvllm:prefix_cache_hits_total{engine=\"0\"} 110\n",
             "vllm:prefix_cache_queries_total 200\nvllm:prefix_cache_hits_total 0\n"});
  const auto rates = cache_rates(before, after);
  EXPECT_DOUBLE_EQ(*rates.at(urls[0]).rate, 0.5);
  EXPECT_DOUBLE_EQ(*rates.at(urls[1]).rate, 0.0);
  EXPECT_DOUBLE_EQ(*total_rate(rates).rate, 0.25);

  CacheReport report = compare_snapshots(false, true, {.engine = before}, {.engine = after, .errors = {"GET x: refused"}});
  nlohmann::json out;
  add_cache_json(report, &out);
  EXPECT_DOUBLE_EQ(out["engine_prefix_hit_rate"].get<double>(), 0.25);
  EXPECT_TRUE(out["router_prefix_hit_rate"].is_null());
  EXPECT_EQ(out["scrape_errors"], nlohmann::json::array({"GET x: refused"}));
  const std::string table = render_cache_table(report);
  EXPECT_NE(table.find("Engines (%):                            25.00"), std::string::npos) << table;
  EXPECT_NE(table.find("scrape failed: GET x: refused"), std::string::npos) << table;
}

TEST(CacheRates, NoLookupsIsNotAZeroRate) {
  const auto rates = cache_rates({}, router_cache_counters({"pdrouter_up 1\n"}));
  EXPECT_FALSE(router_headline_rate(rates, 100).rate.rate.has_value());
  EXPECT_TRUE(router_headline_rate(rates, 100).source.empty());
  EXPECT_FALSE(total_rate({}).rate.has_value());
}

TEST(ScrapeTarget, DefaultsToTheMetricsPath) {
  ScrapeTarget t;
  ASSERT_TRUE(parse_scrape_target("http://127.0.0.1:9100", &t));
  EXPECT_EQ(t.path, "/metrics");
  EXPECT_EQ(t.address.port, 9100);
  ASSERT_TRUE(parse_scrape_target("http://127.0.0.1:9100/engine_metrics", &t));
  EXPECT_EQ(t.path, "/engine_metrics");
  EXPECT_FALSE(parse_scrape_target("127.0.0.1 9100", &t));
}

}  // namespace
}  // namespace pdr::loadgen
