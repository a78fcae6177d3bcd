#include "bench/loadgen/bench_metrics.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bench/loadgen/bench_report.h"

namespace pdr::loadgen {
namespace {

TEST(Distribution, MatchesNumpyLinearPercentiles) {
  // numpy.percentile([1, 2, 3, 4, 10], [50, 90, 99]) = [3, 7.6, 9.76]; mean 4; std 3.1623
  const Distribution d = distribution_of({10, 2, 4, 1, 3}, {90, 99});
  EXPECT_DOUBLE_EQ(d.mean, 4.0);
  EXPECT_DOUBLE_EQ(d.median, 3.0);
  EXPECT_NEAR(d.stddev, 3.16227766, 1e-6);
  ASSERT_EQ(d.percentiles.size(), 2u);
  EXPECT_NEAR(d.percentiles[0].second, 7.6, 1e-9);
  EXPECT_NEAR(d.percentiles[1].second, 9.76, 1e-9);
}

TEST(Distribution, EmptyAndSingle) {
  const Distribution empty = distribution_of({}, {99});
  EXPECT_EQ(empty.mean, 0);
  EXPECT_EQ(empty.percentiles.at(0).second, 0);
  const Distribution one = distribution_of({5}, {99});
  EXPECT_EQ(one.median, 5);
  EXPECT_EQ(one.percentiles.at(0).second, 5);
}

RequestResult ok(double ttft, double latency, uint32_t tokens, std::vector<double> itl) {
  RequestResult r;
  r.success = true;
  r.input_len = 100;
  r.output_tokens = tokens;
  r.ttft_s = ttft;
  r.latency_s = latency;
  r.itl_s = std::move(itl);
  return r;
}

TEST(Summary, VllmDefinitions) {
  RequestResult failed;
  failed.error = "HTTP 503: no decode";
  RequestResult failed_again = failed;
  const std::vector<RequestResult> results = {
      ok(0.1, 0.5, 5, {0.1, 0.1, 0.1, 0.1}),  // TPOT (0.5-0.1)/4 = 100 ms
      ok(0.3, 0.3, 1, {}),                    // one token: no TPOT sample
      failed, failed_again};
  const BenchSummary s = summarize(results, 2.0, {99}, 3);
  EXPECT_EQ(s.completed, 2u);
  EXPECT_EQ(s.failed, 2u);
  EXPECT_EQ(s.errors.at("HTTP 503: no decode"), 2u);
  EXPECT_EQ(s.total_input_tokens, 200u);  // failures do not count
  EXPECT_EQ(s.total_output_tokens, 6u);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 103.0);
  EXPECT_NEAR(s.ttft_ms.mean, 200.0, 1e-9);
  EXPECT_NEAR(s.tpot_ms.mean, 100.0, 1e-9);
  EXPECT_NEAR(s.itl_ms.mean, 100.0, 1e-9);
  EXPECT_NEAR(s.e2el_ms.median, 400.0, 1e-9);
  EXPECT_EQ(s.max_concurrency_observed, 3u);
}

TEST(Report, TableAndJsonCarryTheNumbers) {
  const std::vector<RequestResult> results = {ok(0.1, 0.5, 5, {0.1, 0.1, 0.1, 0.1})};
  const BenchSummary s = summarize(results, 1.0, {50, 99.9}, 1);
  RunInfo info{.backend = "vllm", .base_url = "http://127.0.0.1:1", .endpoint = "/v1/completions",
               .model = "m", .num_prompts = 1, .request_rate = INFINITY};
  const std::string table = render_table(info, s);
  EXPECT_NE(table.find("Successful requests:                    1"), std::string::npos) << table;
  EXPECT_NE(table.find("Mean TTFT (ms):                         100.00"), std::string::npos) << table;
  EXPECT_NE(table.find("P99.9 ITL (ms):"), std::string::npos) << table;
  EXPECT_NE(table.find("Traffic request rate:                   inf"), std::string::npos) << table;
  EXPECT_EQ(table.find("Errors"), std::string::npos);
  EXPECT_NE(table.find("---------------Time to First Token----------------"), std::string::npos);

  const nlohmann::json json = result_json(info, s, results);
  EXPECT_EQ(json["request_rate"], "inf");
  EXPECT_EQ(json["completed"], 1);
  EXPECT_NEAR(json["mean_ttft_ms"].get<double>(), 100.0, 1e-9);
  EXPECT_TRUE(json.contains("p99.9_itl_ms"));
  EXPECT_TRUE(json.contains("p50_e2el_ms"));
  EXPECT_EQ(json["itls"][0].size(), 4u);
  EXPECT_TRUE(json["max_concurrency"].is_null());
}

TEST(Report, FailuresAreListedWithTheirCounts) {
  RequestResult failed;
  failed.error = "stream ended without [DONE]";
  const BenchSummary s = summarize({failed}, 1.0, {99}, 1);
  const std::string table = render_table({.interrupted = true}, s);
  EXPECT_NE(table.find("INTERRUPTED"), std::string::npos);
  EXPECT_NE(table.find("     1 x stream ended without [DONE]"), std::string::npos) << table;
}

}  // namespace
}  // namespace pdr::loadgen
