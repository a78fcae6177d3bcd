// Client parameters refused before any leg (contract in request_checks.h).
#include "proto/request_checks.h"

#include "proto/responses_legs.h"

namespace pdr::proto {

std::optional<std::string> check_token_count(const JsonObjectBody& body, std::string_view key,
                                             std::string_view prefix, int64_t least) {
  if (!body.has(key) || body.is_null(key)) return std::nullopt;
  const std::string name = std::string(prefix) + std::string(key);
  std::optional<int64_t> v;
  if (Status st = body.get_int(key, &v); !st) {
    if (st.code() == StatusCode::kOutOfRange) {
      return name + " must be at most " + std::to_string(kMaxTokenCount) + ", got " +
             std::string(body.get_raw(key).value_or("").substr(0, 24));
    }
    return prefix.empty() ? st.message() : name + ": " + st.message();
  }
  if (*v < least) return name + " must be at least " + std::to_string(least) + ", got " + std::to_string(*v);
  if (*v > kMaxTokenCount) {
    return name + " must be at most " + std::to_string(kMaxTokenCount) + ", got " + std::to_string(*v);
  }
  return std::nullopt;
}

std::optional<std::string> check_client_parameters(std::string_view path, const JsonObjectBody& body,
                                                   int64_t* choices) {
  *choices = 1;
  for (std::string_view key : {"max_tokens", "max_completion_tokens"}) {
    if (auto refusal = check_token_count(body, key, "", 1)) return refusal;
  }
  if (path == kResponsesPath) {
    if (auto refusal = check_token_count(body, "max_output_tokens", "", 1)) return refusal;
  }
  if (body.has("stream") && !body.is_null("stream")) {
    std::optional<bool> stream;
    if (!body.get_bool("stream", &stream).is_ok() || !stream) {
      return "stream must be a boolean (true or false), got " +
             std::string(body.get_raw("stream").value_or("").substr(0, 24));
    }
  }
  if (body.has("n") && !body.is_null("n")) {
    std::optional<int64_t> n;
    if (!body.get_int("n", &n).is_ok() || !n) return std::string("n must be an integer");
    if (*n < 1) return "n must be at least 1, got " + std::to_string(*n);
    *choices = *n;
  }
  return std::nullopt;
}

}  // namespace pdr::proto
