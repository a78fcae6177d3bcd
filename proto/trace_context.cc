#include "proto/trace_context.h"

namespace pdr::proto {

namespace {

// Lower-case hex only: the spec forbids upper case in traceparent.
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

template <size_t N>
bool parse_hex(std::string_view text, std::array<uint8_t, N>* out) {
  if (text.size() != 2 * N) return false;
  for (size_t i = 0; i < N; ++i) {
    const int hi = hex_value(text[2 * i]);
    const int lo = hex_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

template <size_t N>
void append_hex(std::string& out, const std::array<uint8_t, N>& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (uint8_t b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 0x0f];
  }
}

template <size_t N>
bool all_zero(const std::array<uint8_t, N>& bytes) {
  for (uint8_t b : bytes) {
    if (b != 0) return false;
  }
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool is_zero(const TraceId& id) { return all_zero(id); }
bool is_zero(const SpanId& id) { return all_zero(id); }

std::string to_hex(const TraceId& id) {
  std::string out;
  out.reserve(32);
  append_hex(out, id);
  return out;
}

std::string to_hex(const SpanId& id) {
  std::string out;
  out.reserve(16);
  append_hex(out, id);
  return out;
}

bool parse_traceparent(std::string_view text, TraceParent* out) {
  text = trim(text);
  if (text.size() < kTraceParentBytes) return false;
  std::array<uint8_t, 1> version{};
  if (!parse_hex(text.substr(0, 2), &version) || version[0] == 0xff) return false;
  if (version[0] == 0 ? text.size() != kTraceParentBytes
                      : text.size() > kTraceParentBytes && text[kTraceParentBytes] != '-') {
    return false;
  }
  if (text[2] != '-' || text[35] != '-' || text[52] != '-') return false;
  TraceParent p;
  std::array<uint8_t, 1> flags{};
  if (!parse_hex(text.substr(3, 32), &p.trace_id) || !parse_hex(text.substr(36, 16), &p.parent_id) ||
      !parse_hex(text.substr(53, 2), &flags)) {
    return false;
  }
  if (is_zero(p.trace_id) || is_zero(p.parent_id)) return false;
  p.flags = flags[0];
  *out = p;
  return true;
}

std::string format_traceparent(const TraceId& trace, const SpanId& span, uint8_t flags) {
  std::string out;
  out.reserve(kTraceParentBytes);
  out += "00-";
  append_hex(out, trace);
  out += '-';
  append_hex(out, span);
  out += '-';
  append_hex(out, std::array<uint8_t, 1>{flags});
  return out;
}

std::string_view usable_tracestate(std::string_view text) {
  text = trim(text);
  if (text.size() > kMaxTraceState) return {};
  size_t members = text.empty() ? 0 : 1;
  for (char c : text) {
    if (c < 0x20 || c > 0x7e) return {};
    if (c == ',') ++members;
  }
  return members > 32 ? std::string_view() : text;
}

}  // namespace pdr::proto
