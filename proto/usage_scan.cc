// The "usage" scanner (contract in usage_scan.h).
#include "proto/usage_scan.h"

#include <cstring>

namespace pdr::proto {

namespace {

constexpr std::string_view kUsageKey = "\"usage\"";

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_ws(std::string_view s, size_t i) {
  while (i < s.size() && is_ws(s[i])) ++i;
  return i;
}

// The end of the string literal opening at s[i] (the index after its closing quote), or npos.
size_t skip_string(std::string_view s, size_t i) {
  for (++i; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// An unsigned decimal integer at s[i] as JSON writes one (no leading zero); false if there is
// none or it does not fit.
bool read_uint(std::string_view s, size_t i, uint64_t* out) {
  if (i + 1 < s.size() && s[i] == '0' && s[i + 1] >= '0' && s[i + 1] <= '9') return false;
  uint64_t v = 0;
  size_t digits = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, ++digits) {
    if (digits == 19) return false;
    v = v * 10 + static_cast<uint64_t>(s[i] - '0');
  }
  if (digits == 0 || (i < s.size() && (s[i] == '.' || s[i] == 'e' || s[i] == 'E'))) return false;
  *out = v;
  return true;
}

// Reads the object opening at s[i]; on success applies its fields to *usage.
void read_usage_object(std::string_view s, size_t i, TokenUsage* usage) {
  TokenUsage found;
  int depth = 0;
  const size_t end = std::min(s.size(), i + kMaxUsageObjectBytes);
  bool expect_key = false;
  for (; i < end; ++i) {
    const char c = s[i];
    if (c == '{' || c == '[') {
      ++depth;
      expect_key = c == '{' && depth == 1;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) {
        if (found.prompt_tokens) usage->prompt_tokens = found.prompt_tokens;
        if (found.output_tokens) usage->output_tokens = found.output_tokens;
        return;
      }
    } else if (c == ',') {
      expect_key = depth == 1;
    } else if (c == '"') {
      const size_t after = skip_string(s, i);
      if (after == std::string_view::npos || after > end) return;
      if (expect_key) {
        const std::string_view key = s.substr(i + 1, after - i - 2);
        size_t v = skip_ws(s, after);
        if (v >= end || s[v] != ':') return;
        v = skip_ws(s, v + 1);
        uint64_t n = 0;
        if (v < end && read_uint(s.substr(0, end), v, &n)) {
          if (key == "prompt_tokens" || key == "input_tokens") found.prompt_tokens = n;
          if (key == "completion_tokens" || key == "output_tokens") found.output_tokens = n;
        }
        expect_key = false;
        i = v - 1;
      } else {
        i = after - 1;
      }
    }
  }
}

}  // namespace

void scan_usage(std::string_view bytes, TokenUsage* usage) {
  size_t from = 0;
  for (;;) {
    const size_t at = bytes.find(kUsageKey, from);
    if (at == std::string_view::npos) return;
    from = at + kUsageKey.size();
    size_t i = skip_ws(bytes, from);
    if (i >= bytes.size() || bytes[i] != ':') continue;
    i = skip_ws(bytes, i + 1);
    if (i < bytes.size() && bytes[i] == '{') read_usage_object(bytes, i, usage);
  }
}

}  // namespace pdr::proto
