#include "proto/engine_load_page.h"

#include <string>

#include <gtest/gtest.h>

namespace pdr::proto {
namespace {

using Outcome = EngineLoadPage::Outcome;

// What vLLM v1 writes with --data-parallel-size 2 (vllm/v1/metrics/loggers.py: labels
// model_name and engine), trimmed to the families read here plus a counter and a histogram.
constexpr std::string_view kVllmDpPage =
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 3.0\n"
    "vllm:num_requests_running{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 5.0\n"
    "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.0\n"
    "vllm:num_requests_waiting{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 7.0\n"
    "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.25\n"
    "vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 0.75\n"
    "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
    "# TYPE vllm:prompt_tokens_total counter\n"
    "vllm:prompt_tokens_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B-Instruct\"} 1234.0\n"
    "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"0.001\",model_name=\"m\"} 0.0\n";

TEST(EngineLoadPage, ReadsVllmDataParallelPagePerEngine) {
  const EngineLoadPage page = read_engine_load_page(kVllmDpPage);
  ASSERT_EQ(page.outcome, Outcome::kOk);
  EXPECT_EQ(page.node.running, 8u);
  EXPECT_EQ(page.node.waiting, 7u);
  EXPECT_DOUBLE_EQ(page.node.kv_cache_usage, 0.5);  // mean of the engines' shares
  ASSERT_EQ(page.ranks.size(), 2u);
  EXPECT_EQ(page.ranks[0], (EngineLoadFigures{3, 0, 0.25}));
  EXPECT_EQ(page.ranks[1], (EngineLoadFigures{5, 7, 0.75}));
}

TEST(EngineLoadPage, ReadsOlderVllmPageWithoutEngineLabel) {
  // vLLM before v1's engine label: model_name only, and the KV gauge's old name.
  const EngineLoadPage page = read_engine_load_page(
      "vllm:num_requests_running{model_name=\"m\"} 2.0\r\n"
      "vllm:num_requests_waiting{model_name=\"m\"} 1.0\r\n"
      "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.125\r\n");
  ASSERT_EQ(page.outcome, Outcome::kOk);
  EXPECT_EQ(page.node, (EngineLoadFigures{2, 1, 0.125}));
  EXPECT_TRUE(page.ranks.empty());
}

TEST(EngineLoadPage, KvUsageIsOptional) {
  const EngineLoadPage page =
      read_engine_load_page("vllm:num_requests_running 4\nvllm:num_requests_waiting 0\n");
  ASSERT_EQ(page.outcome, Outcome::kOk);
  EXPECT_EQ(page.node.running, 4u);
  EXPECT_LT(page.node.kv_cache_usage, 0);
}

TEST(EngineLoadPage, AddsModelsAndKeepsGapsBetweenEngines) {
  const EngineLoadPage page = read_engine_load_page(
      "vllm:num_requests_running{engine=\"2\",model_name=\"a\"} 1\n"
      "vllm:num_requests_running{engine=\"2\",model_name=\"b\"} 2\n"
      "vllm:num_requests_waiting{engine=\"2\",model_name=\"a\"} 0\n");
  ASSERT_EQ(page.outcome, Outcome::kOk);
  ASSERT_EQ(page.ranks.size(), 3u);
  EXPECT_EQ(page.ranks[2].running, 3u);
  EXPECT_EQ(page.ranks[0], EngineLoadFigures{});
}

TEST(EngineLoadPage, EngineLabelsThatAreNoRankCountForTheNodeOnly) {
  EngineLoadPageLimits limits;
  limits.max_ranks = 4;
  const EngineLoadPage page = read_engine_load_page(
      "vllm:num_requests_running{engine=\"x\"} 1\n"
      "vllm:num_requests_running{engine=\"4\"} 2\n"
      "vllm:num_requests_running{engine=\"-1\"} 4\n"
      "vllm:num_requests_running{engine=\"1\"} 8\n"
      "vllm:num_requests_waiting 0\n",
      limits);
  ASSERT_EQ(page.outcome, Outcome::kOk);
  EXPECT_EQ(page.node.running, 15u);
  ASSERT_EQ(page.ranks.size(), 2u);
  EXPECT_EQ(page.ranks[1].running, 8u);
}

TEST(EngineLoadPage, MissingFamilies) {
  EXPECT_EQ(read_engine_load_page("").outcome, Outcome::kMissingFamilies);
  EXPECT_EQ(read_engine_load_page("# only comments\n\n").outcome, Outcome::kMissingFamilies);
  EXPECT_EQ(read_engine_load_page("vllm:num_requests_running 1\nother_metric 3\n").outcome,
            Outcome::kMissingFamilies);
  // A HELP/TYPE line is not a sample.
  EXPECT_EQ(read_engine_load_page("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_running 1\n").outcome,
            Outcome::kMissingFamilies);
}

TEST(EngineLoadPage, GarbageIsMalformed) {
  EXPECT_EQ(read_engine_load_page("<html><body>502 Bad Gateway</body></html>\n").outcome, Outcome::kMalformed);
  EXPECT_EQ(read_engine_load_page(std::string("\x00\xff\x01garbage{{{", 12)).outcome, Outcome::kMalformed);
  EXPECT_EQ(read_engine_load_page("{\"running\": 3}").outcome, Outcome::kMalformed);
}

TEST(EngineLoadPage, UnusableValuesAreMalformed) {
  for (const char* bad : {"NaN", "+Inf", "-1", "1e12"}) {
    const std::string page = std::string("vllm:num_requests_running ") + bad + "\nvllm:num_requests_waiting 0\n";
    EXPECT_EQ(read_engine_load_page(page).outcome, Outcome::kMalformed) << bad;
  }
  EXPECT_EQ(read_engine_load_page("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
                                  "vllm:kv_cache_usage_perc 1.5\n")
                .outcome,
            Outcome::kMalformed);
}

TEST(EngineLoadPage, MalformedLinesBesideGoodOnesAreSkipped) {
  const EngineLoadPage page = read_engine_load_page(
      "vllm:num_requests_running{engine=\"0\"} 2\n"
      "vllm:num_requests_running{engine=\"0\" 9\n"  // unterminated labels: skipped
      "vllm:num_requests_waiting{engine=\"0\"} 1\n");
  ASSERT_EQ(page.outcome, Outcome::kOk);
  EXPECT_EQ(page.node.running, 2u);
}

TEST(EngineLoadPage, ReadsAtMostMaxLines) {
  EngineLoadPageLimits limits;
  limits.lines.max_lines = 2;
  const EngineLoadPage page = read_engine_load_page(
      "vllm:num_requests_running 1\nother 1\nvllm:num_requests_waiting 1\n", limits);
  EXPECT_EQ(page.outcome, Outcome::kMissingFamilies);
}

TEST(EngineLoadPage, OutcomeNames) {
  EXPECT_EQ(to_string(Outcome::kOk), "ok");
  EXPECT_EQ(to_string(Outcome::kMalformed), "malformed");
  EXPECT_EQ(to_string(Outcome::kMissingFamilies), "missing_families");
}

}  // namespace
}  // namespace pdr::proto
