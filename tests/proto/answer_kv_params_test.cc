#include "proto/answer_kv_params.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

// What a bidirectional NIXL decode ends its answers with (vLLM's field names).
constexpr std::string_view kParams =
    R"({"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[5,6,7],)"
    R"("remote_engine_id":"engine-d1","remote_request_id":"cmpl-x","remote_host":"127.0.0.1","remote_port":28860,"tp_size":1})";

std::string with_params(std::string_view before, std::string_view after) {
  return std::string(before) + std::string(kParams) + std::string(after);
}

TEST(AnswerKvParams, OnlyAKeyWithAValueOtherThanNullCarriesThem) {
  EXPECT_TRUE(carries_kv_params(with_params(R"({"id":"x","kv_transfer_params":)", "}")));
  EXPECT_TRUE(carries_kv_params(with_params(R"({"kv_transfer_params" :  )", "}")));
  EXPECT_TRUE(carries_kv_params(R"({"kv_transfer_params":{}})"));
  EXPECT_TRUE(carries_kv_params(R"({"a":null,"kv_transfer_params":null,"b":{"kv_transfer_params":[1]}})"));
  // Cut off at the end: the value may follow.
  EXPECT_TRUE(carries_kv_params(R"({"kv_transfer_params")"));
  EXPECT_TRUE(carries_kv_params(R"({"kv_transfer_params": )"));
  EXPECT_TRUE(carries_kv_params(R"({"kv_transfer_params":nu)"));

  EXPECT_FALSE(carries_kv_params(""));
  EXPECT_FALSE(carries_kv_params(R"({"id":"x","choices":[]})"));
  EXPECT_FALSE(carries_kv_params(R"({"kv_transfer_params":null})"));
  EXPECT_FALSE(carries_kv_params("{\"kv_transfer_params\" : \n null}"));
  // A string value of that text, or the text inside a string (its quotes escaped there).
  EXPECT_FALSE(carries_kv_params(R"({"content":"kv_transfer_params","x":["kv_transfer_params"]})"));
  EXPECT_FALSE(carries_kv_params(R"({"content":"say \"kv_transfer_params\": {\"a\":1}"})"));
  EXPECT_FALSE(carries_kv_params(R"({"kv_transfer_params_x":{"a":1}})"));
}

TEST(AnswerKvParams, AJsonAnswerGetsNullParamsAndKeepsEveryOtherByte) {
  const std::string answer =
      with_params(R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" hi"}],)"
                  R"("usage":{"prompt_tokens":3},"kv_transfer_params":)",
                  R"(,"prompt_logprobs":null})");
  std::string out;
  ASSERT_EQ(redact_kv_params_json(answer, &out), KvParamsEdit::kRedacted);
  EXPECT_EQ(out, R"({"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" hi"}],)"
                 R"("usage":{"prompt_tokens":3},"kv_transfer_params":null,"prompt_logprobs":null})");
  // Nothing to do: the same bytes go out.
  out = "untouched";
  EXPECT_EQ(redact_kv_params_json(R"({"id":"x","kv_transfer_params":null})", &out), KvParamsEdit::kNone);
  EXPECT_EQ(redact_kv_params_json(R"({"id":"x"})", &out), KvParamsEdit::kNone);
  // Somewhere vLLM never puts them: left alone.
  EXPECT_EQ(redact_kv_params_json(R"({"choices":[{"kv_transfer_params":{"a":1}}]})", &out), KvParamsEdit::kNone);
  EXPECT_EQ(out, "untouched");
  // Not JSON (or not an object) while carrying the key: nothing of it may be relayed.
  EXPECT_EQ(redact_kv_params_json(with_params(R"({"kv_transfer_params":)", ""), &out), KvParamsEdit::kRefused);
  EXPECT_EQ(redact_kv_params_json(with_params(R"([{"kv_transfer_params":)", "}]"), &out), KvParamsEdit::kRefused);
}

TEST(AnswerKvParams, AResponsesAnswerGetsNullParamsAtTheTopAndInItsResponseObject) {
  std::string out;
  ASSERT_EQ(redact_kv_params_json(with_params(R"({"id":"resp_1","object":"response","kv_transfer_params":)", "}"), &out),
            KvParamsEdit::kRedacted);
  EXPECT_EQ(out, R"({"id":"resp_1","object":"response","kv_transfer_params":null})");
  const std::string event_data = with_params(
      R"({"type":"response.completed","response":{"id":"resp_1","status":"completed","kv_transfer_params":)",
      R"(},"sequence_number":9})");
  ASSERT_EQ(redact_kv_params_json(event_data, &out), KvParamsEdit::kRedacted);
  EXPECT_EQ(out, R"({"type":"response.completed","response":{"id":"resp_1","status":"completed",)"
                 R"("kv_transfer_params":null},"sequence_number":9})");
}

TEST(AnswerKvParams, OnlyTheStreamEventCarryingThemIsRewritten) {
  const std::string before =
      "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"A\"}}]}\n\n"
      "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"B\"},\"finish_reason\":\"length\"}]}\n\n";
  const std::string after = "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
  const std::string stream = before + with_params("data: {\"id\":\"c1\",\"choices\":[],\"kv_transfer_params\":", "}\n\n") + after;
  std::string out;
  ASSERT_EQ(redact_kv_params_events(stream, false, &out), KvParamsEdit::kRedacted);
  EXPECT_EQ(out, before + "data: {\"id\":\"c1\",\"choices\":[],\"kv_transfer_params\":null}\n\n" + after);
  // Without them (or with null ones), nothing is rewritten.
  out = "untouched";
  EXPECT_EQ(redact_kv_params_events(before + after, false, &out), KvParamsEdit::kNone);
  EXPECT_EQ(redact_kv_params_events("data: {\"kv_transfer_params\":null}\n\n", false, &out), KvParamsEdit::kNone);
  EXPECT_EQ(out, "untouched");
}

TEST(AnswerKvParams, NamedEventsCrLfAndSplitDataLinesKeepTheirShape) {
  // A Responses stream's last event: its event line and CRLF endings stay; the params in its
  // response object go.
  const std::string completed = with_params(
      "event: response.completed\r\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\","
      "\"kv_transfer_params\":",
      "},\"sequence_number\":9}\r\n\r\n");
  const std::string created =
      "event: response.created\r\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\","
      "\"kv_transfer_params\":null},\"sequence_number\":0}\r\n\r\n";
  std::string out;
  ASSERT_EQ(redact_kv_params_events(created + completed, false, &out), KvParamsEdit::kRedacted);
  EXPECT_EQ(out, created +
                     "event: response.completed\r\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\","
                     "\"kv_transfer_params\":null},\"sequence_number\":9}\r\n\r\n");
  // One JSON object over several data lines (SSE joins them with "\n"): as many lines afterwards.
  const std::string split = with_params("id: 7\ndata: {\"id\":\"c1\",\ndata:\"kv_transfer_params\":\ndata: ", "}\n\n");
  ASSERT_EQ(redact_kv_params_events(split, false, &out), KvParamsEdit::kRedacted);
  EXPECT_EQ(out, "id: 7\ndata: {\"id\":\"c1\",\ndata: \"kv_transfer_params\":\ndata: null}\n\n");
  // A byte order mark before the data line (SSE readers drop one at the stream's start).
  ASSERT_EQ(redact_kv_params_events(with_params("\xEF\xBB\xBF" "data: {\"kv_transfer_params\":", "}\n\n"), false, &out),
            KvParamsEdit::kRedacted);
  EXPECT_EQ(out, "data: {\"kv_transfer_params\":null}\n\n");
  // The stream's last event without its blank line (the stream ended there).
  ASSERT_EQ(redact_kv_params_events(with_params("data: {\"kv_transfer_params\":", "}"), false, &out),
            KvParamsEdit::kRedacted);
  EXPECT_EQ(out, "data: {\"kv_transfer_params\":null}\n");
}

TEST(AnswerKvParams, ParamsThatCannotBeRemovedAreRefused) {
  std::string out;
  // Not JSON.
  EXPECT_EQ(redact_kv_params_events(with_params("data: {\"kv_transfer_params\":", "\n\n"), false, &out),
            KvParamsEdit::kRefused);
  // Outside any data field.
  EXPECT_EQ(redact_kv_params_events(with_params(": {\"kv_transfer_params\":", "}\n\n"), false, &out),
            KvParamsEdit::kRefused);
  // In the rest of an event whose start was relayed already (an event over the relay's limit).
  const std::string rest = with_params("\"x\",\"kv_transfer_params\":", "}\n\n");
  EXPECT_EQ(redact_kv_params_events(rest, true, &out), KvParamsEdit::kRefused);
  // The rest of such an event without them: the events after it are still edited.
  const std::string clean_rest = "\"x\"}\n\n" + with_params("data: {\"kv_transfer_params\":", "}\n\n");
  ASSERT_EQ(redact_kv_params_events(clean_rest, true, &out), KvParamsEdit::kRedacted);
  EXPECT_EQ(out, "\"x\"}\n\ndata: {\"kv_transfer_params\":null}\n\n");
}

}  // namespace
}  // namespace pdr::proto
