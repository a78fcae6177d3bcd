#include "proto/prometheus_merge.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

Labels node(const std::string& address, const std::string& role) {
  return {{"pdrouter_node", address}, {"pdrouter_role", role}};
}

constexpr const char* kPage =
    "# HELP vllm:num_requests_running Number of requests running.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n"
    "# HELP vllm:e2e_request_latency_seconds Latency.\n"
    "# TYPE vllm:e2e_request_latency_seconds histogram\n"
    "vllm:e2e_request_latency_seconds_bucket{le=\"0.5\",model_name=\"m\"} 1\n"
    "vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\",model_name=\"m\"} 2\n"
    "vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 1.25\n"
    "vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 2\n";

TEST(PromMerge, LabelsEverySampleAndGroupsFamiliesAcrossNodes) {
  PromMerger merger;
  PromPageStats a = merger.add(kPage, node("127.0.0.1:8001", "prefill"));
  PromPageStats b = merger.add(kPage, node("127.0.0.1:8002", "decode"));
  EXPECT_EQ(a.samples, 5u);
  EXPECT_EQ(b.samples, 5u);
  EXPECT_EQ(a.malformed + b.malformed + a.conflicts + b.conflicts, 0u);
  EXPECT_EQ(merger.render(),
            "# HELP vllm:num_requests_running Number of requests running.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            "vllm:num_requests_running{pdrouter_node=\"127.0.0.1:8001\",pdrouter_role=\"prefill\",engine=\"0\","
            "model_name=\"m\"} 3.0\n"
            "vllm:num_requests_running{pdrouter_node=\"127.0.0.1:8002\",pdrouter_role=\"decode\",engine=\"0\","
            "model_name=\"m\"} 3.0\n"
            "# HELP vllm:e2e_request_latency_seconds Latency.\n"
            "# TYPE vllm:e2e_request_latency_seconds histogram\n"
            "vllm:e2e_request_latency_seconds_bucket{pdrouter_node=\"127.0.0.1:8001\",pdrouter_role=\"prefill\","
            "le=\"0.5\",model_name=\"m\"} 1\n"
            "vllm:e2e_request_latency_seconds_bucket{pdrouter_node=\"127.0.0.1:8001\",pdrouter_role=\"prefill\","
            "le=\"+Inf\",model_name=\"m\"} 2\n"
            "vllm:e2e_request_latency_seconds_sum{pdrouter_node=\"127.0.0.1:8001\",pdrouter_role=\"prefill\","
            "model_name=\"m\"} 1.25\n"
            "vllm:e2e_request_latency_seconds_count{pdrouter_node=\"127.0.0.1:8001\",pdrouter_role=\"prefill\","
            "model_name=\"m\"} 2\n"
            "vllm:e2e_request_latency_seconds_bucket{pdrouter_node=\"127.0.0.1:8002\",pdrouter_role=\"decode\","
            "le=\"0.5\",model_name=\"m\"} 1\n"
            "vllm:e2e_request_latency_seconds_bucket{pdrouter_node=\"127.0.0.1:8002\",pdrouter_role=\"decode\","
            "le=\"+Inf\",model_name=\"m\"} 2\n"
            "vllm:e2e_request_latency_seconds_sum{pdrouter_node=\"127.0.0.1:8002\",pdrouter_role=\"decode\","
            "model_name=\"m\"} 1.25\n"
            "vllm:e2e_request_latency_seconds_count{pdrouter_node=\"127.0.0.1:8002\",pdrouter_role=\"decode\","
            "model_name=\"m\"} 2\n");
}

TEST(PromMerge, SamplesWithoutLabelsTimestampsAndSpecialValues) {
  PromMerger merger;
  const PromPageStats s = merger.add("up 1\nx_total NaN 1700000000000\ny -Inf\nz +Inf\nw 1e-3\r\n",
                                     node("127.0.0.1:1", "decode"));
  EXPECT_EQ(s.samples, 5u);
  EXPECT_EQ(s.malformed, 0u);
  const std::string out = merger.render();
  EXPECT_NE(out.find("up{pdrouter_node=\"127.0.0.1:1\",pdrouter_role=\"decode\"} 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_total{pdrouter_node=\"127.0.0.1:1\",pdrouter_role=\"decode\"} NaN 1700000000000\n"),
            std::string::npos);
  EXPECT_EQ(out.find("# TYPE"), std::string::npos);  // untyped families get no TYPE line
}

TEST(PromMerge, MalformedLinesAreRefusedAndCounted) {
  PromMerger merger;
  const char* bad[] = {
      "1abc 1",                         // name starts with a digit
      "a{b=\"c} 1",                     // unterminated value
      "a{b=\"c\\x\"} 1",                // bad escape
      "a{b=c} 1",                       // unquoted
      "a{pdrouter_node=\"forged\"} 1",  // pdrouter's own label
      "a 1 2 3",                        // junk after the timestamp
      "a one",                          // not a number
      "a inf",                          // not the format's spelling
      "a",                              // no value
      "a{b=\"c\"}1",                    // no space before the value
      "a{-b=\"c\"} 1",                  // bad label name
      "# TYPE a nonsense",              // unknown type
      "# TYPE 9a gauge",                // bad family name
      "a 1 12.5",                       // timestamp not an integer
  };
  uint64_t malformed = 0;
  for (const char* line : bad) malformed += merger.add(line, node("127.0.0.1:1", "decode")).malformed;
  EXPECT_EQ(malformed, std::size(bad));
  EXPECT_EQ(merger.render(), "");
}

TEST(PromMerge, EscapedValuesAndOurLabelValuesStaySafe) {
  PromMerger merger;
  merger.add("a{path=\"x\\\"y\\\\z\\n\"} 1\n", {{"pdrouter_node", "h\"\n"}});
  EXPECT_EQ(merger.render(), "a{pdrouter_node=\"h\\\"\\n\",path=\"x\\\"y\\\\z\\n\"} 1\n");
}

TEST(PromMerge, LimitsBoundEveryPart) {
  PromMergeLimits limits;
  limits.max_lines = 3;
  limits.max_labels = 2;
  limits.max_label_value_bytes = 4;
  limits.max_line_bytes = 64;
  limits.max_samples = 4;
  limits.max_help_bytes = 5;
  PromMerger merger(limits);
  PromPageStats s = merger.add("# HELP a 123456\\\\789\na{x=\"1\",y=\"2\",z=\"3\"} 1\na{x=\"12345\"} 1\na 1\na 2\n",
                               node("127.0.0.1:1", "decode"));
  EXPECT_EQ(s.malformed, 2u);   // three labels, a long value
  EXPECT_EQ(s.over_limit, 2u);  // lines 4 and 5
  EXPECT_EQ(s.samples, 0u);
  s = merger.add("a 1\na 2\na 3\n", {});
  EXPECT_EQ(s.samples, 3u);
  s = merger.add("a 4\na 5\n" + std::string(100, 'b') + " 1\n", {});
  EXPECT_EQ(s.samples, 1u);
  EXPECT_EQ(s.over_limit, 1u);
  EXPECT_EQ(s.malformed, 1u);  // the long line
  // HELP cut to 5 bytes without leaving half an escape ("12345" of "123456\\\\789").
  EXPECT_EQ(merger.render(), "# HELP a 12345\na 1\na 2\na 3\na 4\n");
}

TEST(PromMerge, ATypeConflictDropsTheLaterNodesSamples) {
  PromMerger merger;
  merger.add("# TYPE a gauge\na 1\n", node("127.0.0.1:1", "decode"));
  const PromPageStats s = merger.add("# TYPE a counter\na 2\nb 3\n", node("127.0.0.1:2", "decode"));
  EXPECT_EQ(s.conflicts, 1u);
  EXPECT_EQ(s.samples, 1u);
  const std::string out = merger.render();
  EXPECT_EQ(out.find("a{pdrouter_node=\"127.0.0.1:2\""), std::string::npos) << out;
}

TEST(PromMerge, OwnLinesJoinTheirFamily) {
  PromMerger merger;
  merger.add_own("pdrouter_engine_metrics_scrape_ok", "1 when the node's /metrics was read", "gauge",
                 "pdrouter_engine_metrics_scrape_ok{node=\"127.0.0.1:1\"} 0");
  merger.add_own("pdrouter_engine_metrics_scrape_ok", "ignored", "gauge",
                 "pdrouter_engine_metrics_scrape_ok{node=\"127.0.0.1:2\"} 1");
  EXPECT_EQ(merger.render(),
            "# HELP pdrouter_engine_metrics_scrape_ok 1 when the node's /metrics was read\n"
            "# TYPE pdrouter_engine_metrics_scrape_ok gauge\n"
            "pdrouter_engine_metrics_scrape_ok{node=\"127.0.0.1:1\"} 0\n"
            "pdrouter_engine_metrics_scrape_ok{node=\"127.0.0.1:2\"} 1\n");
}

}  // namespace
}  // namespace pdr::proto
