#include "bench/loadgen/stream_request.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace pdr::loadgen {
namespace {

const std::vector<http::Header> kSse = {{"Content-Type", "text/event-stream; charset=utf-8"}};

BenchRequest request_of(uint32_t input_len = 3) {
  BenchRequest r;
  r.prompt_json = "\"a b c\"";
  r.prompt_text = "a b c";
  r.input_len = input_len;
  r.output_len = 2;
  return r;
}

std::string text_event(std::string_view text) {
  return "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"" +
         std::string(text) + "\",\"finish_reason\":null}],\"usage\":null}\n\n";
}
const std::string kUsage =
    "data: {\"id\":\"cmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,"
    "\"total_tokens\":9}}\n\n";
const std::string kDone = "data: [DONE]\n\n";

TEST(BuildRequest, CompletionsBodyAsVllmBenchSendsIt) {
  EndpointOptions endpoint{.model = "m", .headers = {{"Authorization", "Bearer k"}}};
  const http::UpstreamRequest req = build_request(endpoint, request_of());
  EXPECT_EQ(req.path, "/v1/completions");
  const nlohmann::json body = nlohmann::json::parse(req.body);
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["prompt"], "a b c");
  EXPECT_EQ(body["max_tokens"], 2);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["temperature"], 0.0);
  EXPECT_EQ(req.headers.at(0).name, "Authorization");
}

TEST(BuildRequest, TokenIdsAreSplicedAsAnArray) {
  BenchRequest r = request_of();
  r.prompt_json = "[1001,1002]";
  const nlohmann::json body = nlohmann::json::parse(build_request({.model = "m"}, r).body);
  EXPECT_EQ(body["prompt"], nlohmann::json::array({1001, 1002}));
}

TEST(BuildRequest, ChatSendsOneUserMessage) {
  EndpointOptions endpoint{.path = "/v1/chat/completions", .chat = true, .model = "m",
                           .ignore_eos = false};
  const nlohmann::json body = nlohmann::json::parse(build_request(endpoint, request_of()).body);
  EXPECT_EQ(body["messages"][0]["role"], "user");
  EXPECT_EQ(body["messages"][0]["content"], "a b c");
  EXPECT_EQ(body["max_completion_tokens"], 2);
  EXPECT_FALSE(body.contains("prompt"));
  EXPECT_FALSE(body.contains("ignore_eos"));
}

TEST(StreamMeasurement, TimesTheTextChunksAndTakesTokensFromUsage) {
  StreamMeasurement m(request_of(), 1.0);
  m.on_head(200, kSse);
  m.on_body(text_event(" x"), 1.25);
  // The second chunk arrives split across reads; its time is when it completes.
  const std::string second = text_event(" y");
  m.on_body(second.substr(0, 10), 1.3);
  m.on_body(second.substr(10), 1.5);
  m.on_body(kUsage + kDone, 1.6);
  m.on_complete(1.7);
  const RequestResult& r = m.result();
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.25);
  ASSERT_EQ(r.itl_s.size(), 1u);
  EXPECT_DOUBLE_EQ(r.itl_s[0], 0.25);
  EXPECT_NEAR(r.latency_s, 0.7, 1e-12);
  EXPECT_EQ(r.output_tokens, 2u);
  EXPECT_EQ(r.input_len, 7u) << "usage.prompt_tokens wins over the generated length";
}

TEST(StreamMeasurement, WithoutUsageCountsChunksWithText) {
  StreamMeasurement m(request_of(3), 0);
  m.on_head(200, kSse);
  m.on_body(text_event(" x") + text_event("") + text_event(" y") + text_event(" z") + kDone, 0.1);
  m.on_complete(0.2);
  ASSERT_TRUE(m.result().success) << m.result().error;
  EXPECT_EQ(m.result().output_tokens, 3u);
  EXPECT_EQ(m.result().input_len, 3u);
}

TEST(StreamMeasurement, ChatRoleChunkIsNotTheFirstToken) {
  StreamMeasurement m(request_of(), 0);
  m.on_head(200, kSse);
  m.on_body("data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n", 0.1);
  m.on_body("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" hi\"}}]}\n\n" + kDone, 0.4);
  m.on_complete(0.5);
  ASSERT_TRUE(m.result().success) << m.result().error;
  EXPECT_DOUBLE_EQ(m.result().ttft_s, 0.4);
}

std::string ids_event(std::string_view ids) {
  return "data: {\"request_id\":\"generate-tokens-1\",\"choices\":[{\"index\":0,\"token_ids\":[" +
         std::string(ids) + "],\"finish_reason\":null,\"logprobs\":null}],\"usage\":null}\n\n";
}

TEST(StreamMeasurement, GenerateChunksCountTheirTokenIds) {
  // /inference/v1/generate streams token ids, no text: the first chunk with ids is the first
  // token, the ids are the tokens when no usage comes.
  StreamMeasurement m(request_of(), 1.0, false, /*token_ids=*/true);
  m.on_head(200, kSse);
  m.on_body(ids_event(""), 1.1);
  m.on_body(ids_event("17"), 1.25);
  m.on_body(ids_event("3,4"), 1.5);
  m.on_body(kDone, 1.6);
  m.on_complete(1.7);
  const RequestResult& r = m.result();
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.25);
  ASSERT_EQ(r.itl_s.size(), 1u);
  EXPECT_EQ(r.output_tokens, 3u);
  // The same stream read as completions carries no text at all.
  StreamMeasurement text(request_of(), 1.0);
  text.on_head(200, kSse);
  text.on_body(ids_event("17") + kDone, 1.2);
  text.on_complete(1.3);
  EXPECT_EQ(text.result().error, "stream carried no generated text");
}

TEST(BuildRequest, GenerateBodyCarriesSamplingParams) {
  BenchRequest r = request_of();
  r.prompt_json = "[1001,1002]";
  EndpointOptions endpoint{.path = "/inference/v1/generate", .model = "m", .ignore_eos = false,
                           .generate = true};
  const http::UpstreamRequest req = build_request(endpoint, r);
  EXPECT_EQ(req.path, "/inference/v1/generate");
  const nlohmann::json body = nlohmann::json::parse(req.body);
  EXPECT_EQ(body["token_ids"], nlohmann::json::array({1001, 1002}));
  EXPECT_EQ(body["sampling_params"], nlohmann::json({{"max_tokens", 2}, {"temperature", 0.0}}));
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_FALSE(body.contains("ignore_eos"));
  EXPECT_FALSE(body.contains("temperature"));
}

RequestResult measure(int status, const std::vector<http::Header>& headers, const std::string& body) {
  StreamMeasurement m(request_of(), 0);
  m.on_head(status, headers);
  m.on_body(body, 0.1);
  m.on_complete(0.2);
  return m.result();
}

TEST(StreamMeasurement, FailuresSayWhy) {
  const std::vector<http::Header> json = {{"Content-Type", "application/json"}};
  EXPECT_EQ(measure(503, json, R"({"error":{"message":"no decode instance is up","type":"x","code":503}})").error,
            "HTTP 503: no decode instance is up");
  EXPECT_EQ(measure(404, {}, "Not Found").error, "HTTP 404: Not Found");
  EXPECT_EQ(measure(200, json, "{}").error,
            "HTTP 200 but not text/event-stream (the server ignored \"stream\": true)");
  EXPECT_EQ(measure(200, kSse, text_event(" x")).error, "stream ended without [DONE]");
  EXPECT_EQ(measure(200, kSse, text_event(" x") + "data: {\"choi").error, "stream ended inside an event");
  EXPECT_EQ(measure(200, kSse, kDone).error, "stream carried no generated text");
  EXPECT_EQ(measure(200, kSse, text_event(" x") + "data: {\"error\":{\"message\":\"decode failed\"}}\n\n" + kDone).error,
            "error event: decode failed");
  EXPECT_EQ(measure(200, kSse, text_event(" x") + kDone + text_event(" y")).error, "event after [DONE]");
  EXPECT_NE(measure(200, kSse, "data: not json\n\n").error.find("undecodable chunk"), std::string::npos);
  EXPECT_FALSE(measure(200, kSse, text_event(" x") + kDone).error.size());
}

TEST(StreamMeasurement, ConnectionErrorKeepsTheFirstReason) {
  StreamMeasurement m(request_of(), 0);
  m.on_head(200, kSse);
  m.on_body("data: {\"error\":{\"message\":\"boom\"}}\n\n", 0.1);
  EXPECT_TRUE(m.failed_early());
  m.on_error("connection lost before the answer ended", 0.3);
  EXPECT_EQ(m.result().error, "error event: boom");
  EXPECT_DOUBLE_EQ(m.result().latency_s, 0.3);
}

}  // namespace
}  // namespace pdr::loadgen
