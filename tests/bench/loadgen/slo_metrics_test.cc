#include "bench/loadgen/slo_metrics.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bench/loadgen/bench_report.h"

namespace pdr::loadgen {
namespace {

RequestResult ok(double ttft, std::vector<double> gaps) {
  RequestResult r;
  r.success = true;
  r.http_status = 200;
  r.output_tokens = static_cast<uint32_t>(gaps.size() + 1);
  r.ttft_s = ttft;
  r.itl_s = std::move(gaps);
  return r;
}

RequestResult failed(int status) {
  RequestResult r;
  r.http_status = status;
  r.error = status == 0 ? "connection lost before the answer ended" : "HTTP " + std::to_string(status);
  return r;
}

TEST(Tbt, MeanOfTheSlowestTenthOfTheGaps) {
  EXPECT_EQ(slowest_tenth_mean({}), 0.0);
  // 1 to 9 gaps: ceil(n / 10) = 1, the slowest one.
  EXPECT_DOUBLE_EQ(slowest_tenth_mean({0.01}), 0.01);
  EXPECT_DOUBLE_EQ(slowest_tenth_mean({0.01, 0.5, 0.02}), 0.5);
  // 20 gaps: the 2 slowest, (0.3 + 0.2) / 2.
  std::vector<double> gaps(18, 0.01);
  gaps.insert(gaps.begin() + 5, 0.3);
  gaps.push_back(0.2);
  EXPECT_DOUBLE_EQ(slowest_tenth_mean(gaps), 0.25);
  // 11 gaps: ceil(1.1) = 2.
  std::vector<double> eleven = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1};
  EXPECT_DOUBLE_EQ(slowest_tenth_mean(eleven), 1.05);
}

TEST(Slo, AttainmentAndGoodputByHand) {
  // TTFT 1 s, TBT 100 ms.
  const SloOptions slo{.ttft_s = 1.0, .tbt_s = 0.1};
  std::vector<double> steady(30, 0.05);          // TBT 50 ms
  std::vector<double> stalls(30, 0.05);          // 3 slowest: 0.4, 0.05, 0.05 -> TBT 0.1667
  stalls[7] = 0.4;
  std::vector<double> one_stall(30, 0.05);       // 3 slowest: 0.2, 0.05, 0.05 -> TBT 0.1
  one_stall[3] = 0.2;
  const std::vector<RequestResult> results = {
      ok(0.5, steady),      // met
      ok(1.0, steady),      // met: TTFT at the objective counts
      ok(1.5, steady),      // TTFT missed
      ok(0.2, stalls),      // TBT missed (its mean ITL, 61.7 ms, would pass)
      ok(0.2, one_stall),   // TBT exactly 100 ms: met
      ok(0.3, {}),          // one chunk, no gap: met
      failed(503), failed(429), failed(503), failed(0)};
  const SloSummary s = summarize_slo(results, 4.0, slo, {99});
  EXPECT_EQ(s.requests, 10u);
  EXPECT_EQ(s.met, 4u);
  EXPECT_EQ(s.met_ttft, 5u);
  EXPECT_EQ(s.met_tbt, 5u);
  EXPECT_DOUBLE_EQ(s.attainment, 0.4);
  EXPECT_DOUBLE_EQ(s.goodput, 1.0);  // 4 met in 4 s
  EXPECT_EQ(s.failed_statuses.at(503), 2u);
  EXPECT_EQ(s.failed_statuses.at(429), 1u);
  EXPECT_EQ(s.failed_statuses.count(0), 0u) << "no answer head: not an HTTP status";
  // TBT over the 6 completed: 50, 50, 50, 166.7, 100, 0 ms.
  EXPECT_NEAR(s.tbt_ms.mean, (50 * 3 + 1000.0 * 0.5 / 3 + 100) / 6, 1e-9);
  EXPECT_TRUE(meets_slo(results[0], slo));
  EXPECT_FALSE(meets_slo(results[3], slo));
  EXPECT_FALSE(meets_slo(results[6], slo));
}

TEST(Slo, NothingSentIsZeroNotNan) {
  const SloSummary s = summarize_slo({}, 0.0, {}, {99});
  EXPECT_EQ(s.requests, 0u);
  EXPECT_EQ(s.attainment, 0.0);
  EXPECT_EQ(s.goodput, 0.0);
}

TEST(SloReport, JsonAndTableCarryTheFigures) {
  const std::vector<RequestResult> results = {ok(0.5, {0.01, 0.02}), failed(429)};
  const SloSummary s = summarize_slo(results, 2.0, {.ttft_s = 10, .tbt_s = 0.1}, {99});
  nlohmann::json out;
  add_slo_json(s, results, &out);
  EXPECT_EQ(out["slo_ttft_ms"], 10000.0);
  EXPECT_EQ(out["slo_tbt_ms"], 100.0);
  EXPECT_EQ(out["slo_met"], 1);
  EXPECT_EQ(out["slo_requests"], 2);
  EXPECT_DOUBLE_EQ(out["slo_attainment"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(out["goodput"].get<double>(), 0.5);
  EXPECT_EQ(out["http_429"], 1);
  EXPECT_EQ(out["http_503"], 0);
  EXPECT_EQ(out["failed_http_status"]["429"], 1);
  ASSERT_EQ(out["tbts"].size(), 2u);
  EXPECT_DOUBLE_EQ(out["tbts"][0].get<double>(), 0.02);
  EXPECT_DOUBLE_EQ(out["tbts"][1].get<double>(), 0.0);
  EXPECT_NEAR(out["p99_tbt_ms"].get<double>(), 20.0, 1e-9);
  const std::string table = render_slo_table(s);
  EXPECT_NE(table.find("SLO attainment (%):                     50.00"), std::string::npos) << table;
  EXPECT_NE(table.find("Requests meeting both:                  1 of 2"), std::string::npos) << table;
  EXPECT_NE(table.find("HTTP 429:                               1"), std::string::npos) << table;
  EXPECT_NE(table.find("HTTP 503:                               0"), std::string::npos) << table;
}

}  // namespace
}  // namespace pdr::loadgen
