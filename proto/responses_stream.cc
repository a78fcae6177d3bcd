#include "proto/responses_stream.h"

#include "proto/json_splice.h"

namespace pdr::proto {
namespace {

constexpr std::string_view kSequenceKey = "\"sequence_number\"";
constexpr size_t kMaxDigits = 15;

bool is_space(char c) { return c == ' ' || c == '\t'; }

bool id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
         c == '.' || c == ':';
}

// The text after `"key"` at `at`: skips `\s*:\s*`; npos if no colon follows.
size_t value_start(std::string_view text, size_t at) {
  while (at < text.size() && is_space(text[at])) ++at;
  if (at >= text.size() || text[at] != ':') return std::string_view::npos;
  ++at;
  while (at < text.size() && is_space(text[at])) ++at;
  return at;
}

// The id of the response object of a response.created event in `events`, or "".
std::string_view created_response_id(std::string_view events) {
  const size_t created = events.find("\"response.created\"");
  if (created == std::string_view::npos) return {};
  // The event around it: from the blank line before it to the one after.
  size_t begin = events.rfind("\n\n", created);
  begin = begin == std::string_view::npos ? 0 : begin + 2;
  size_t end = events.find("\n\n", created);
  if (end == std::string_view::npos) end = events.size();
  const std::string_view event = events.substr(begin, end - begin);
  // The response object's own "id" is the first "id" member after "response": it has no nested
  // object before it in vLLM's dump (pydantic field order) nor in one sorted by key.
  const size_t response = event.find("\"response\"");
  if (response == std::string_view::npos) return {};
  for (size_t at = event.find("\"id\"", response); at != std::string_view::npos; at = event.find("\"id\"", at + 4)) {
    size_t v = value_start(event, at + 4);
    if (v == std::string_view::npos || v >= event.size() || event[v] != '"') continue;
    ++v;
    size_t e = v;
    while (e < event.size() && e - v <= ResponsesStreamFollower::kMaxResponseId && id_char(event[e])) ++e;
    if (e >= event.size() || event[e] != '"' || e == v || e - v > ResponsesStreamFollower::kMaxResponseId) return {};
    return event.substr(v, e - v);
  }
  return {};
}

}  // namespace

void ResponsesStreamFollower::observe(std::string_view events) {
  if (response_id_.empty()) response_id_ = std::string(created_response_id(events));
  // The last numbered event of the chunk sets the next number.
  for (size_t at = events.rfind(kSequenceKey); at != std::string_view::npos;
       at = at == 0 ? std::string_view::npos : events.rfind(kSequenceKey, at - 1)) {
    size_t v = value_start(events, at + kSequenceKey.size());
    if (v == std::string_view::npos) continue;
    int64_t n = 0;
    size_t digits = 0;
    while (v < events.size() && events[v] >= '0' && events[v] <= '9' && digits <= kMaxDigits) {
      n = n * 10 + (events[v] - '0');
      ++v;
      ++digits;
    }
    if (digits == 0 || digits > kMaxDigits) continue;
    next_sequence_ = n + 1;
    return;
  }
}

std::string responses_failure_events(std::string_view response_id, int64_t sequence_number,
                                     std::string_view message, std::string_view code) {
  std::string out = "event: error\ndata: ";
  out += JsonObjectWriter()
             .string("type", "error")
             .string("code", code)
             .string("message", message)
             .null("param")
             .integer("sequence_number", sequence_number)
             .finish();
  out += "\n\nevent: response.failed\ndata: ";
  const std::string error = JsonObjectWriter().string("code", "server_error").string("message", message).finish();
  const std::string response = JsonObjectWriter()
                                   .string("id", response_id)
                                   .string("object", "response")
                                   .string("status", "failed")
                                   .raw("error", error)
                                   .finish();
  out += JsonObjectWriter()
             .string("type", "response.failed")
             .integer("sequence_number", sequence_number + 1)
             .raw("response", response)
             .finish();
  out += "\n\n";
  return out;
}

}  // namespace pdr::proto
