#include "proto/usage_scan.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

TokenUsage scan(std::string_view text) {
  TokenUsage usage;
  scan_usage(text, &usage);
  return usage;
}

TEST(UsageScan, OpenAiAnswer) {
  const TokenUsage u = scan(
      R"({"id":"cmpl-1","choices":[{"text":"hi"}],"usage":{"prompt_tokens":12,"total_tokens":28,)"
      R"("completion_tokens":16,"prompt_tokens_details":{"cached_tokens":3}}})");
  EXPECT_EQ(u.prompt_tokens, 12u);
  EXPECT_EQ(u.output_tokens, 16u);
}

TEST(UsageScan, StreamNullsThenTheFinalUsageChunk) {
  const std::string events =
      "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n"
      "data: {\"choices\":[{\"text\":\"b\"}],\"usage\":null}\n\n"
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n"
      "data: [DONE]\n\n";
  const TokenUsage u = scan(events);
  EXPECT_EQ(u.prompt_tokens, 5u);
  EXPECT_EQ(u.output_tokens, 2u);
  EXPECT_FALSE(scan("data: {\"usage\": null}\n\n").prompt_tokens);
}

TEST(UsageScan, AnthropicStreamMergesStartAndDelta) {
  TokenUsage u;
  scan_usage("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":"
             "{\"input_tokens\":9,\"output_tokens\":0}}}\n\n",
             &u);
  EXPECT_EQ(u.prompt_tokens, 9u);
  EXPECT_EQ(u.output_tokens, 0u);
  scan_usage("event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n", &u);
  EXPECT_EQ(u.prompt_tokens, 9u);  // kept from message_start
  EXPECT_EQ(u.output_tokens, 4u);
}

TEST(UsageScan, GeneratedTextCannotForgeUsage) {
  // Inside a JSON string every quote is escaped, so the key never appears there.
  const TokenUsage u = scan(R"({"choices":[{"text":"\"usage\": {\"prompt_tokens\": 999}"}]})");
  EXPECT_FALSE(u.prompt_tokens);
  EXPECT_FALSE(u.output_tokens);
}

TEST(UsageScan, StringsAndNestingInsideUsageAreSkipped) {
  const TokenUsage u = scan(
      R"({"usage": {"note": "a } \" { prompt_tokens", "details": {"prompt_tokens": 77, "x": [1, {"y": 2}]},)"
      R"( "prompt_tokens" : 3 , "completion_tokens": 4}})");
  EXPECT_EQ(u.prompt_tokens, 3u);  // the top level's, not the nested one
  EXPECT_EQ(u.output_tokens, 4u);
}

TEST(UsageScan, MalformedOrCutOffUsageIsIgnored) {
  EXPECT_FALSE(scan(R"({"usage": {"prompt_tokens": 5, "completion_tokens": 6)").prompt_tokens);  // cut off
  EXPECT_FALSE(scan(R"({"usage": {"prompt_tokens": -5}})").prompt_tokens);
  EXPECT_FALSE(scan(R"({"usage": {"prompt_tokens": 5.5}})").prompt_tokens);
  EXPECT_FALSE(scan(R"({"usage": {"prompt_tokens": 05}})").prompt_tokens);  // not a JSON number
  EXPECT_EQ(scan(R"({"usage": {"prompt_tokens": 0}})").prompt_tokens, 0u);
  EXPECT_FALSE(scan(R"({"usage": {"prompt_tokens": 99999999999999999999}})").prompt_tokens);
  EXPECT_FALSE(scan(R"({"usage": "5"})").prompt_tokens);
  EXPECT_FALSE(scan(R"({"usage" 5})").prompt_tokens);
  EXPECT_FALSE(scan(R"("usage")").prompt_tokens);
  const std::string huge = R"({"usage": {"pad": ")" + std::string(kMaxUsageObjectBytes, 'x') +
                           R"(", "prompt_tokens": 1}})";
  EXPECT_FALSE(scan(huge).prompt_tokens);
}

TEST(UsageScan, ResponsesApiUsage) {
  const TokenUsage u = scan(
      R"({"type":"response.completed","response":{"id":"resp_1","usage":{"input_tokens":10,)"
      R"("input_tokens_details":{"cached_tokens":0},"output_tokens":20,"total_tokens":30}}})");
  EXPECT_EQ(u.prompt_tokens, 10u);
  EXPECT_EQ(u.output_tokens, 20u);
}

}  // namespace
}  // namespace pdr::proto
