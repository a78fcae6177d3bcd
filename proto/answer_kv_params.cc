#include "proto/answer_kv_params.h"

#include <string.h>  // memmem (GNU)

#include <algorithm>

#include "proto/json_splice.h"

namespace pdr::proto {

namespace {

constexpr std::string_view kKey = "\"kv_transfer_params\"";
static_assert(kKey.size() == kKvParamsKeyBytes);

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

JsonLimits limits_for(size_t bytes) {
  JsonLimits limits;
  limits.max_bytes = std::max<size_t>(bytes, 1);
  limits.max_depth = 128;  // deeper than any answer vLLM writes; deeper ones are refused
  return limits;
}

// Nulls the body's kv_transfer_params member if it is there and not null.
bool null_member(JsonObjectBody& body) {
  const std::optional<std::string_view> raw = body.get_raw("kv_transfer_params");
  if (!raw || *raw == "null") return false;
  body.set_raw("kv_transfer_params", "null");
  return true;
}

// Nulls them where vLLM puts them: the top level, and the "response" object of a Responses
// stream event. True if anything changed.
bool null_params(JsonObjectBody& body, const JsonLimits& limits) {
  bool changed = null_member(body);
  const std::optional<std::string_view> response = body.get_raw("response");
  if (response && !response->empty() && response->front() == '{' && carries_kv_params(*response)) {
    JsonObjectBody inner;
    if (JsonObjectBody::parse_member_borrowed(*response, limits, &inner).is_ok() && null_member(inner)) {
      body.set_raw("response", inner.render());
      changed = true;
    }
  }
  return changed;
}

// One line of an event: its text and its line ending ("" for a last line without one).
struct Line {
  std::string_view text;
  std::string_view ending;
};

// The line starting at `pos`. Line endings are SSE's: "\r\n", "\n" or "\r".
Line line_at(std::string_view bytes, size_t pos) {
  size_t end = pos;
  while (end < bytes.size() && bytes[end] != '\n' && bytes[end] != '\r') ++end;
  size_t after = end;
  if (after < bytes.size()) after += (bytes[after] == '\r' && after + 1 < bytes.size() && bytes[after + 1] == '\n') ? 2 : 1;
  return Line{bytes.substr(pos, end - pos), bytes.substr(end, after - end)};
}

// Just past the blank line that ends the event starting at `pos`, or the end of `bytes`.
size_t event_end(std::string_view bytes, size_t pos) {
  while (pos < bytes.size()) {
    const Line line = line_at(bytes, pos);
    pos += line.text.size() + line.ending.size();
    if (line.text.empty()) return pos;
  }
  return bytes.size();
}

// The value of a "data" field line (SSE: "data" alone, or "data:" and the value with one
// leading space dropped); false for any other line. A UTF-8 byte order mark before it is
// skipped (SSE readers drop one at the start of a stream).
bool data_value(std::string_view line, std::string_view* value) {
  if (line.starts_with("\xEF\xBB\xBF")) line.remove_prefix(3);
  if (!line.starts_with("data")) return false;
  if (line.size() == 4) {
    *value = {};
    return true;
  }
  if (line[4] != ':') return false;
  *value = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
  return true;
}

KvParamsEdit edit_event(std::string_view event, std::string* out) {
  std::string data;
  bool has_data = false;
  for (size_t pos = 0; pos < event.size();) {
    const Line line = line_at(event, pos);
    pos += line.text.size() + line.ending.size();
    std::string_view value;
    if (!data_value(line.text, &value)) continue;
    if (has_data) data += '\n';
    data += value;
    has_data = true;
  }
  // The key outside any data field, or data that is not a JSON object: nothing safe to relay.
  if (!has_data) return KvParamsEdit::kRefused;
  const JsonLimits limits = limits_for(data.size());
  JsonObjectBody body;
  if (!JsonObjectBody::parse_borrowed(data, limits, &body).is_ok()) return KvParamsEdit::kRefused;
  if (!null_params(body, limits)) return KvParamsEdit::kNone;
  bool data_written = false;
  for (size_t pos = 0; pos < event.size();) {
    const Line line = line_at(event, pos);
    pos += line.text.size() + line.ending.size();
    std::string_view value;
    if (!data_value(line.text, &value)) {
      *out += line.text;
      *out += line.ending;
    } else if (!data_written) {
      // Line by line: the only line breaks in the rendered text are the ones joining data lines
      // (JSON strings hold none), so it splits back into as many data lines.
      const std::string rendered = body.render();
      const std::string_view ending = line.ending.empty() ? std::string_view("\n") : line.ending;
      for (size_t from = 0;;) {
        const size_t nl = rendered.find('\n', from);
        *out += "data: ";
        *out += std::string_view(rendered).substr(from, nl == std::string::npos ? std::string::npos : nl - from);
        *out += ending;
        if (nl == std::string::npos) break;
        from = nl + 1;
      }
      data_written = true;
    }
  }
  return KvParamsEdit::kRedacted;
}

}  // namespace

bool carries_kv_params(std::string_view text) {
  const char* const base = text.data();
  const size_t n = text.size();
  size_t from = 0;
  while (from + kKey.size() <= n) {
    const void* hit = memmem(base + from, n - from, kKey.data(), kKey.size());
    if (hit == nullptr) return false;
    size_t i = static_cast<size_t>(static_cast<const char*>(hit) - base) + kKey.size();
    from = i;
    while (i < n && is_space(text[i])) ++i;
    if (i == n) return true;  // cut off: its value may follow
    if (text[i] == ',' || text[i] == '}' || text[i] == ']') continue;  // a string value, not a key
    if (text[i] != ':') return true;  // not JSON as vLLM writes it: looked at closer
    ++i;
    while (i < n && is_space(text[i])) ++i;
    if (text.substr(i, 4) == "null") continue;
    return true;
  }
  return false;
}

KvParamsEdit redact_kv_params_json(std::string_view answer, std::string* out) {
  if (!carries_kv_params(answer)) return KvParamsEdit::kNone;
  const JsonLimits limits = limits_for(answer.size());
  JsonObjectBody body;
  if (!JsonObjectBody::parse_borrowed(answer, limits, &body).is_ok()) return KvParamsEdit::kRefused;
  if (!null_params(body, limits)) return KvParamsEdit::kNone;
  *out = body.render();
  return KvParamsEdit::kRedacted;
}

KvParamsEdit redact_kv_params_events(std::string_view events, bool starts_mid_event, std::string* out) {
  if (!carries_kv_params(events)) return KvParamsEdit::kNone;
  std::string result;
  size_t copied = 0;  // events[0, copied) are in result
  bool changed = false;
  for (size_t pos = 0; pos < events.size();) {
    const size_t end = event_end(events, pos);
    const std::string_view event = events.substr(pos, end - pos);
    if (carries_kv_params(event)) {
      // The start of this event went out already: too late to edit it.
      if (pos == 0 && starts_mid_event) return KvParamsEdit::kRefused;
      std::string edited;
      switch (edit_event(event, &edited)) {
        case KvParamsEdit::kRefused:
          return KvParamsEdit::kRefused;
        case KvParamsEdit::kRedacted:
          result.append(events.substr(copied, pos - copied));
          result += edited;
          copied = end;
          changed = true;
          break;
        case KvParamsEdit::kNone:
          break;
      }
    }
    pos = end;
  }
  if (!changed) return KvParamsEdit::kNone;
  result.append(events.substr(copied));
  *out = std::move(result);
  return KvParamsEdit::kRedacted;
}

}  // namespace pdr::proto
