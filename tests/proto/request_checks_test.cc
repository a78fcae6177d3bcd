// Client parameters pdrouter refuses before any leg (proto/request_checks.h).
#include "proto/request_checks.h"

#include <gtest/gtest.h>

#include <string>

#include "proto/generate_request.h"
#include "proto/responses_legs.h"

namespace pdr::proto {
namespace {

// The refusal for `body` on `path`, or "" when it passes.
std::string refusal(std::string_view path, const std::string& body, int64_t* choices = nullptr) {
  JsonObjectBody parsed;
  Status st = JsonObjectBody::parse(body, JsonLimits(), &parsed);
  EXPECT_TRUE(st.is_ok()) << body << ": " << st.to_string();
  int64_t n = 0;
  auto out = check_client_parameters(path, parsed, choices != nullptr ? choices : &n);
  return out.value_or("");
}

constexpr std::string_view kCompletions = "/v1/completions";

TEST(RequestChecks, TokenCapsArePositiveIntegersThatFit) {
  EXPECT_EQ(refusal(kCompletions, R"({"max_tokens":16})"), "");
  EXPECT_EQ(refusal(kCompletions, R"({"max_tokens":null,"max_completion_tokens":null})"), "");
  EXPECT_EQ(refusal(kCompletions, R"({"max_tokens":2147483647})"), "");
  EXPECT_EQ(refusal(kCompletions, R"({"max_tokens":0})"), "max_tokens must be at least 1, got 0");
  EXPECT_EQ(refusal(kCompletions, R"({"max_tokens":-1})"), "max_tokens must be at least 1, got -1");
  EXPECT_EQ(refusal(kCompletions, R"({"max_tokens":2147483648})"),
            "max_tokens must be at most 2147483647, got 2147483648");
  EXPECT_EQ(refusal(kCompletions, R"({"max_tokens":9223372036854775807})"),
            "max_tokens must be at most 2147483647, got 9223372036854775807");
  EXPECT_EQ(refusal(kCompletions, R"({"max_tokens":10000000000})"),
            "max_tokens must be at most 2147483647, got 10000000000");
  EXPECT_EQ(refusal(kCompletions, R"({"max_tokens":1e10})"), "max_tokens must be an integer, got 1e10");
  EXPECT_EQ(refusal(kCompletions, R"({"max_tokens":"5"})"), "max_tokens must be an integer, got a string");
  EXPECT_EQ(refusal("/v1/chat/completions", R"({"max_completion_tokens":2147483648})"),
            "max_completion_tokens must be at most 2147483647, got 2147483648");
}

TEST(RequestChecks, MaxOutputTokensOnResponsesOnly) {
  EXPECT_EQ(refusal(kResponsesPath, R"({"max_output_tokens":20})"), "");
  EXPECT_EQ(refusal(kResponsesPath, R"({"max_output_tokens":0})"), "max_output_tokens must be at least 1, got 0");
  EXPECT_EQ(refusal(kResponsesPath, R"({"max_output_tokens":-1})"), "max_output_tokens must be at least 1, got -1");
  EXPECT_EQ(refusal(kResponsesPath, R"({"max_output_tokens":9223372036854775807})"),
            "max_output_tokens must be at most 2147483647, got 9223372036854775807");
  EXPECT_EQ(refusal(kResponsesPath, R"({"max_output_tokens":1.5})"),
            "max_output_tokens must be an integer, got 1.5");
  EXPECT_EQ(refusal(kCompletions, R"({"max_output_tokens":0})"), "");  // not a completions field
}

TEST(RequestChecks, StreamIsABoolean) {
  for (const char* ok : {R"({"stream":true})", R"({"stream":false})", R"({"stream":null})", "{}"}) {
    EXPECT_EQ(refusal(kCompletions, ok), "") << ok;
  }
  EXPECT_EQ(refusal(kCompletions, R"({"stream":"yes"})"), R"(stream must be a boolean (true or false), got "yes")");
  EXPECT_EQ(refusal(kCompletions, R"({"stream":1})"), "stream must be a boolean (true or false), got 1");
}

TEST(RequestChecks, ChoicesFromN) {
  int64_t choices = 0;
  EXPECT_EQ(refusal(kCompletions, R"({"n":3})", &choices), "");
  EXPECT_EQ(choices, 3);
  EXPECT_EQ(refusal(kCompletions, R"({"n":null})", &choices), "");
  EXPECT_EQ(choices, 1);
  EXPECT_EQ(refusal(kCompletions, R"({"n":0})"), "n must be at least 1, got 0");
  EXPECT_EQ(refusal(kCompletions, R"({"n":"2"})"), "n must be an integer");
}

TEST(RequestChecks, GenerateTokenCountsHaveTheSameBound) {
  for (const char* key : {"max_tokens", "min_tokens"}) {
    JsonObjectBody body;
    const std::string text = std::string(R"({"token_ids":[1],"sampling_params":{")") + key + R"(":2147483648}})";
    ASSERT_TRUE(JsonObjectBody::parse(text, JsonLimits(), &body).is_ok());
    GenerateView view;
    Status st = check_generate_request(body, JsonLimits(), &view);
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << key;
    EXPECT_EQ(st.message(), std::string("sampling_params.") + key + " must be at most 2147483647, got 2147483648");
  }
}

}  // namespace
}  // namespace pdr::proto
