#include "proto/anthropic_messages.h"

#include <optional>

namespace pdr::proto {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The raw value without the whitespace a JSON text may hold inside brackets: "[ ]" is empty.
bool empty_array(std::string_view raw) {
  if (raw.size() < 2 || raw.front() != '[') return false;
  for (size_t i = 1; i + 1 < raw.size(); ++i) {
    if (!is_space(raw[i])) return false;
  }
  return true;
}

}  // namespace

bool is_anthropic_path(std::string_view path) {
  return path == kMessagesPath || path == kMessagesCountTokensPath;
}

Status check_messages_request(const JsonObjectBody& body) {
  // model: vLLM's AnthropicMessagesRequest requires it and refuses "".
  if (!body.has("model")) return Status(StatusCode::kMissingKey, "model is required");
  std::optional<std::string> model;
  if (body.is_null("model")) return Status(StatusCode::kWrongType, "model must be a string, got null");
  if (Status st = body.get_string("model", &model); !st) return st;
  if (model->empty()) return Status(StatusCode::kInvalidValue, "model must not be empty");

  // messages: the conversation. Its items are vLLM's to judge (their shapes grow with the API).
  const std::optional<std::string_view> messages = body.get_raw("messages");
  if (!messages) return Status(StatusCode::kMissingKey, "messages is required");
  if (messages->empty() || messages->front() != '[') {
    return Status(StatusCode::kWrongType, "messages must be an array");
  }
  if (empty_array(*messages)) {
    return Status(StatusCode::kInvalidValue, "messages must hold at least one message");
  }

  // max_tokens: required by Anthropic's API (and an int without a default in vLLM); the prefill
  // leg is capped at 1 by rewriting it, so a client's value must be usable first.
  if (!body.has("max_tokens")) return Status(StatusCode::kMissingKey, "max_tokens is required");
  if (body.is_null("max_tokens")) {
    return Status(StatusCode::kWrongType, "max_tokens must be an integer, got null");
  }
  std::optional<int64_t> max_tokens;
  if (Status st = body.get_int("max_tokens", &max_tokens); !st) return st;
  if (*max_tokens < 1) {
    return Status(StatusCode::kInvalidValue, "max_tokens must be at least 1, got " + std::to_string(*max_tokens));
  }

  // stream: which answer the client reads (events or one JSON object).
  if (body.has("stream") && !body.is_null("stream")) {
    std::optional<bool> stream;
    if (Status st = body.get_bool("stream", &stream); !st) return st;
  }
  return Status::ok();
}

std::string_view anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 402: return "billing_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    case 504: return "timeout_error";
    default: break;
  }
  return status >= 400 && status < 500 ? "invalid_request_error" : "api_error";
}

std::string anthropic_error_body(int status, std::string_view message) {
  const std::string error =
      JsonObjectWriter().string("type", anthropic_error_type(status)).string("message", message).finish();
  return JsonObjectWriter().string("type", "error").raw("error", error).finish();
}

std::string anthropic_error_event(int status, std::string_view message) {
  std::string out = "event: error\ndata: ";
  out += anthropic_error_body(status, message);
  out += "\n\n";
  return out;
}

}  // namespace pdr::proto
