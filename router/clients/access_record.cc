// The access log's line encoder and the traceparent reader (contracts in access_record.h).
#include "router/clients/access_record.h"

#include <fmt/format.h>

#include <ctime>

namespace pdr::router::clients {

namespace {

// The length of the valid UTF-8 sequence starting at s[i], or 0 when it is not one (overlong
// forms, surrogates and code points above U+10FFFF are not valid).
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

void append_optional_uint(std::string* out, std::string_view key, std::optional<uint64_t> v) {
  out->append(",\"").append(key).append("\":");
  if (v) {
    fmt::format_to(std::back_inserter(*out), "{}", *v);
  } else {
    out->append("null");
  }
}

void append_string_or_null(std::string* out, std::string_view key, std::string_view v) {
  out->append(",\"").append(key).append("\":");
  if (v.empty()) {
    out->append("null");
  } else {
    append_json_text(out, v);
  }
}

bool is_hex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return false;
  }
  return true;
}

}  // namespace

void append_json_text(std::string* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      size_t run = i + 1;
      while (run < s.size()) {
        const auto r = static_cast<unsigned char>(s[run]);
        if (r < 0x20 || r >= 0x7f || r == '"' || r == '\\') break;
        ++run;
      }
      out->append(s.data() + i, run - i);
      i = run;
      continue;
    }
    if (c >= 0x80) {
      const size_t n = utf8_sequence(s, i);
      if (n == 0) {
        out->append("\\ufffd");
        ++i;
      } else {
        out->append(s.data() + i, n);
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:  // the other control characters and DEL
        out->append("\\u00");
        out->push_back(kHex[c >> 4]);
        out->push_back(kHex[c & 0xF]);
    }
    ++i;
  }
  out->push_back('"');
}

void append_access_line(const AccessRecord& r, std::string* out) {
  using namespace std::chrono;
  const auto since_epoch = duration_cast<milliseconds>(r.time.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(since_epoch / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  fmt::format_to(std::back_inserter(*out), "{{\"time\":\"{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z\"",
                 utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                 static_cast<int>(since_epoch % 1000));
  append_string_or_null(out, "request_id", r.request_id);
  append_string_or_null(out, "trace_id", r.trace_id);
  append_string_or_null(out, "client", r.client);
  append_string_or_null(out, "tenant", r.tenant);
  append_string_or_null(out, "method", r.method);
  append_string_or_null(out, "path", r.path);
  fmt::format_to(std::back_inserter(*out), ",\"status\":{}", r.status);
  append_string_or_null(out, "outcome", r.outcome);
  out->append(r.stream ? ",\"stream\":true" : ",\"stream\":false");
  append_string_or_null(out, "prefill", r.prefill);
  append_string_or_null(out, "decode", r.decode);
  append_optional_uint(out, "prefill_rank", r.prefill_rank);
  append_optional_uint(out, "decode_rank", r.decode_rank);
  fmt::format_to(std::back_inserter(*out), ",\"retries\":{}", r.retries);
  append_optional_uint(out, "prompt_tokens", r.prompt_tokens);
  append_optional_uint(out, "output_tokens", r.output_tokens);
  append_string_or_null(out, "cache_source", r.cache_source);
  const bool cache = !r.cache_source.empty();
  append_optional_uint(out, "cache_matched", cache ? std::optional<uint64_t>(r.cache_matched) : std::nullopt);
  append_optional_uint(out, "cache_prompt", cache ? std::optional<uint64_t>(r.cache_prompt) : std::nullopt);
  fmt::format_to(std::back_inserter(*out), ",\"queue_ms\":{:.3f}", r.queue_ms);
  if (r.ttft_ms) {
    fmt::format_to(std::back_inserter(*out), ",\"ttft_ms\":{:.3f}", *r.ttft_ms);
  } else {
    out->append(",\"ttft_ms\":null");
  }
  fmt::format_to(std::back_inserter(*out), ",\"total_ms\":{:.3f},\"bytes_in\":{},\"bytes_out\":{}}}\n", r.total_ms,
                 r.bytes_in, r.bytes_out);
}

std::string trace_id_of(std::string_view v) {
  // version "-" trace-id "-" parent-id "-" flags; a later version may append fields after a '-'.
  if (v.size() < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return {};
  const std::string_view version = v.substr(0, 2), trace = v.substr(3, 32), parent = v.substr(36, 16),
                         flags = v.substr(53, 2);
  if (!is_hex(version) || !is_hex(trace) || !is_hex(parent) || !is_hex(flags)) return {};
  if (version == "ff" || version == "FF") return {};
  if (version == "00" && v.size() != 55) return {};
  if (v.size() > 55 && v[55] != '-') return {};
  if (trace.find_first_not_of('0') == std::string_view::npos) return {};
  if (parent.find_first_not_of('0') == std::string_view::npos) return {};
  std::string out(trace);
  for (char& c : out) {
    if (c >= 'A' && c <= 'F') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace pdr::router::clients
