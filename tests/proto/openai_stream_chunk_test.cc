#include "proto/openai_stream_chunk.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

StreamChunk parse_ok(std::string_view data) {
  StreamChunk chunk;
  Status st = parse_stream_chunk(data, &chunk);
  EXPECT_TRUE(st.is_ok()) << data << ": " << st.to_string();
  return chunk;
}

TEST(OpenAiStreamChunk, VllmCompletionsChunk) {
  StreamChunk c = parse_ok(
      R"({"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" hello","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null})");
  EXPECT_FALSE(c.done);
  EXPECT_EQ(c.content_bytes, 6u);
  EXPECT_EQ(c.choices_with_content, 1u);
  EXPECT_FALSE(c.prompt_tokens);
  EXPECT_FALSE(c.completion_tokens);
  EXPECT_FALSE(c.finish_reason);
  EXPECT_FALSE(c.error_message);
}

TEST(OpenAiStreamChunk, ChatRoleOnlyFirstChunkHasNoContent) {
  StreamChunk c = parse_ok(
      R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]})");
  EXPECT_EQ(c.content_bytes, 0u);
  EXPECT_EQ(c.choices_with_content, 0u);
  EXPECT_FALSE(c.finish_reason);
}

TEST(OpenAiStreamChunk, ChatContentChunk) {
  StreamChunk c = parse_ok(
      R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" w\u00f6rld"},"logprobs":null,"finish_reason":null}]})");
  EXPECT_EQ(c.content_bytes, 7u);  // unescaped: " w" + 2-byte o-umlaut + "rld"
  EXPECT_EQ(c.choices_with_content, 1u);
}

TEST(OpenAiStreamChunk, ReasoningCountsAsContent) {
  StreamChunk c = parse_ok(
      R"({"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"think"}},{"index":1,"delta":{"reasoning":"abc"}},{"index":2,"delta":{"reasoning_content":"xy","reasoning":"xy"}}]})");
  EXPECT_EQ(c.content_bytes, 10u);  // 5 + 3 + 2: the doubled spelling counts once
  EXPECT_EQ(c.choices_with_content, 3u);
}

TEST(OpenAiStreamChunk, FinalUsageChunk) {
  StreamChunk c = parse_ok(
      R"({"id":"x","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":7500,"total_tokens":7700,"completion_tokens":200}})");
  EXPECT_EQ(c.content_bytes, 0u);
  EXPECT_EQ(c.prompt_tokens, 7500u);
  EXPECT_EQ(c.completion_tokens, 200u);
}

TEST(OpenAiStreamChunk, FinishReasonIsTheFirstNonNull) {
  StreamChunk c = parse_ok(
      R"({"choices":[{"index":0,"text":"","finish_reason":null},{"index":1,"text":"a","finish_reason":"length"},{"index":2,"text":"bc","finish_reason":"stop"}]})");
  EXPECT_EQ(c.finish_reason, "length");
  EXPECT_EQ(c.content_bytes, 3u);
  EXPECT_EQ(c.choices_with_content, 2u);
}

TEST(OpenAiStreamChunk, Done) {
  for (std::string_view text : {"[DONE]", " [DONE]\r\n", "\t[DONE] "}) {
    StreamChunk c = parse_ok(text);
    EXPECT_TRUE(c.done) << text;
    EXPECT_EQ(c.content_bytes, 0u);
  }
  StreamChunk c;
  EXPECT_EQ(parse_stream_chunk("[DONE", &c).code(), StatusCode::kMalformed);
  EXPECT_EQ(parse_stream_chunk("[done]", &c).code(), StatusCode::kMalformed);
}

TEST(OpenAiStreamChunk, ErrorShapes) {
  StreamChunk c = parse_ok(
      R"({"error":{"message":"prefill failed: connection refused","type":"BadGateway","code":502}})");
  EXPECT_EQ(c.error_message, "prefill failed: connection refused");
  c = parse_ok(
      R"({"object":"error","message":"This model's maximum context length is 4096 tokens.","type":"BadRequestError","param":null,"code":400})");
  EXPECT_EQ(c.error_message, "This model's maximum context length is 4096 tokens.");
  // An error without a string message is still an error.
  c = parse_ok(R"({"error":"overloaded"})");
  EXPECT_EQ(c.error_message, "overloaded");
  c = parse_ok(R"({"error": {"code": 500}})");
  EXPECT_EQ(c.error_message, R"({"code":500})");
  // "error": null is not an error.
  c = parse_ok(R"({"error":null,"choices":[{"text":"a"}]})");
  EXPECT_FALSE(c.error_message);
  EXPECT_EQ(c.content_bytes, 1u);
}

TEST(OpenAiStreamChunk, ErrorMessageIsCappedAtACharacterBoundary) {
  std::string long_message;
  for (int i = 0; i < 1000; ++i) long_message += "\xC3\xA9";  // 2000 bytes of e-acute
  StreamChunk c = parse_ok(R"({"error":{"message":")" + long_message + "\"}}");
  ASSERT_TRUE(c.error_message);
  EXPECT_LE(c.error_message->size(), kMaxErrorMessageBytes);
  EXPECT_EQ(c.error_message->substr(c.error_message->size() - 3), "...");
  const std::string kept = c.error_message->substr(0, c.error_message->size() - 3);
  EXPECT_EQ(kept.size() % 2, 0u);
  EXPECT_EQ(kept, long_message.substr(0, kept.size()));
}

TEST(OpenAiStreamChunk, ErrorMessageOfAnHttpErrorBody) {
  EXPECT_EQ(error_message_of(R"({"error":{"message":"no decode instance","type":"ServiceUnavailable"}})"),
            "no decode instance");
  EXPECT_EQ(error_message_of(R"({"object":"error","message":"bad","type":"BadRequestError","code":400})"),
            "bad");
  EXPECT_FALSE(error_message_of("<html>502 Bad Gateway</html>"));
  EXPECT_FALSE(error_message_of(""));
  EXPECT_FALSE(error_message_of("[1]"));
  EXPECT_FALSE(error_message_of(R"({"detail":"Not Found"})"));
  EXPECT_FALSE(error_message_of(R"({"object":"list","message":"x"})"));
  EXPECT_FALSE(error_message_of(std::string(kMaxStreamChunkBytes + 1, ' ')));
}

TEST(OpenAiStreamChunk, ToleratesAbsentAndNullFields) {
  StreamChunk c = parse_ok("{}");
  EXPECT_EQ(c.content_bytes, 0u);
  c = parse_ok(R"({"choices":null,"usage":{"prompt_tokens":null}})");
  EXPECT_FALSE(c.prompt_tokens);
  c = parse_ok(R"({"choices":[{"delta":null,"text":null,"extra":{"nested":[1,2]}}],"usage":{}})");
  EXPECT_EQ(c.choices_with_content, 0u);
  EXPECT_FALSE(c.completion_tokens);
}

TEST(OpenAiStreamChunk, RefusesWhatItCannotRead) {
  struct Case {
    std::string_view data;
    StatusCode code;
    const char* words;
  } cases[] = {
      {"", StatusCode::kMalformed, "at byte 0"},
      {"{\"choices\":[", StatusCode::kMalformed, "at byte 12"},
      {"{\"a\":1}x", StatusCode::kMalformed, "at byte 7"},
      {"data: {}", StatusCode::kMalformed, "at byte 0"},
      {"{\"t\":\"\xFF\"}", StatusCode::kMalformed, "invalid JSON"},
      {"[1]", StatusCode::kWrongType, "not a JSON object"},
      {"\"[DONE]\"", StatusCode::kWrongType, "not a JSON object"},
      {R"({"choices":{}})", StatusCode::kWrongType, "choices must be an array"},
      {R"({"choices":[1]})", StatusCode::kWrongType, "choices[0] must be an object"},
      {R"({"choices":[{"text":"a"},{"text":5}]})", StatusCode::kWrongType, "choices[1].text"},
      {R"({"choices":[{"delta":"x"}]})", StatusCode::kWrongType, "choices[0].delta must be an object"},
      {R"({"choices":[{"delta":{"content":["a"]}}]})", StatusCode::kWrongType, "choices[0].delta.content"},
      {R"({"choices":[{"delta":{"reasoning_content":1}}]})", StatusCode::kWrongType, "reasoning_content"},
      {R"({"choices":[{"finish_reason":1}]})", StatusCode::kWrongType, "choices[0].finish_reason"},
      {R"({"usage":[]})", StatusCode::kWrongType, "usage must be an object"},
      {R"({"usage":{"completion_tokens":-1}})", StatusCode::kOutOfRange, "usage.completion_tokens"},
      {R"({"usage":{"completion_tokens":1.5}})", StatusCode::kWrongType, "usage.completion_tokens"},
      {R"({"usage":{"prompt_tokens":"7"}})", StatusCode::kWrongType, "usage.prompt_tokens"},
      {R"({"usage":{"prompt_tokens":1e3}})", StatusCode::kWrongType, "usage.prompt_tokens"},
  };
  for (const Case& c : cases) {
    StreamChunk chunk;
    chunk.content_bytes = 42;
    Status st = parse_stream_chunk(c.data, &chunk);
    EXPECT_EQ(st.code(), c.code) << c.data << ": " << st.to_string();
    EXPECT_NE(st.message().find(c.words), std::string::npos) << c.data << ": " << st.message();
    EXPECT_EQ(chunk.content_bytes, 42u) << "out must be untouched on error";
  }
}

TEST(OpenAiStreamChunk, Limits) {
  StreamChunk c;
  const std::string big = R"({"choices":[{"text":")" + std::string(kMaxStreamChunkBytes, 'a') + "\"}]}";
  EXPECT_EQ(parse_stream_chunk(big, &c).code(), StatusCode::kTooLarge);
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  EXPECT_EQ(parse_stream_chunk(deep, &c).code(), StatusCode::kTooDeep);
  // Large but within the limit: fine, and the thread's parser serves small chunks after it.
  const std::string large = R"({"choices":[{"text":")" + std::string(1 << 20, 'a') + "\"}]}";
  EXPECT_EQ(parse_ok(large).content_bytes, 1u << 20);
  EXPECT_EQ(parse_ok(R"({"choices":[{"text":"ab"}]})").content_bytes, 2u);
}

TEST(OpenAiStreamChunk, BigTokenCounts) {
  StreamChunk c = parse_ok(R"({"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":0}})");
  EXPECT_EQ(c.prompt_tokens, 18446744073709551615ull);
  EXPECT_EQ(c.completion_tokens, 0u);
}

}  // namespace
}  // namespace pdr::proto
