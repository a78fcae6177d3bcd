#include "proto/otlp_span.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace pdr::proto {

namespace {

// Length of the valid UTF-8 sequence at the start of `s` (0: not valid).
size_t utf8_sequence(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  size_t n = 0;
  uint32_t min = 0;
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
    min = 0x80;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    min = 0x800;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  uint32_t cp = b0 & (0x7f >> n);
  for (size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (b & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

void append_u64(uint64_t v, std::string* out) {
  char buf[24];
  out->append(buf, static_cast<size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf));
}

void append_attribute_value(const SpanAttribute& a, std::string* out) {
  switch (a.type) {
    case SpanAttribute::Type::kString:
      *out += "{\"stringValue\":";
      append_json_string(a.string_value, out);
      break;
    case SpanAttribute::Type::kInt: {
      *out += "{\"intValue\":\"";
      char buf[24];
      out->append(buf, static_cast<size_t>(std::to_chars(buf, buf + sizeof buf, a.int_value).ptr - buf));
      *out += '"';
      break;
    }
    case SpanAttribute::Type::kDouble: {
      *out += "{\"doubleValue\":";
      if (std::isfinite(a.double_value)) {
        char buf[32];
        out->append(buf, static_cast<size_t>(std::to_chars(buf, buf + sizeof buf, a.double_value).ptr - buf));
      } else {
        *out += std::isnan(a.double_value) ? "\"NaN\"" : a.double_value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
      }
      break;
    }
    case SpanAttribute::Type::kBool:
      *out += a.bool_value ? "{\"boolValue\":true" : "{\"boolValue\":false";
      break;
  }
  *out += '}';
}

void append_attributes(const std::vector<SpanAttribute>& attributes, std::string* out) {
  *out += '[';
  bool first = true;
  for (const SpanAttribute& a : attributes) {
    if (!first) *out += ',';
    first = false;
    *out += "{\"key\":";
    append_json_string(a.key, out);
    *out += ",\"value\":";
    append_attribute_value(a, out);
    *out += '}';
  }
  *out += ']';
}

void append_span(const Span& s, std::string* out) {
  *out += "{\"traceId\":\"";
  *out += to_hex(s.trace_id);
  *out += "\",\"spanId\":\"";
  *out += to_hex(s.span_id);
  *out += '"';
  if (!is_zero(s.parent_span_id)) {
    *out += ",\"parentSpanId\":\"";
    *out += to_hex(s.parent_span_id);
    *out += '"';
  }
  if (!s.trace_state.empty()) {
    *out += ",\"traceState\":";
    append_json_string(s.trace_state, out);
  }
  *out += ",\"name\":";
  append_json_string(s.name, out);
  *out += ",\"kind\":";
  append_u64(static_cast<uint64_t>(s.kind), out);
  *out += ",\"startTimeUnixNano\":\"";
  append_u64(s.start_unix_ns, out);
  *out += "\",\"endTimeUnixNano\":\"";
  append_u64(s.end_unix_ns, out);
  *out += "\",\"attributes\":";
  append_attributes(s.attributes, out);
  *out += ",\"status\":{";
  if (s.status != Span::StatusCode::kUnset) {
    if (!s.status_message.empty()) {
      *out += "\"message\":";
      append_json_string(s.status_message, out);
      *out += ',';
    }
    *out += "\"code\":";
    append_u64(static_cast<uint64_t>(s.status), out);
  }
  *out += "}}";
}

}  // namespace

SpanAttribute SpanAttribute::str(std::string key, std::string value) {
  SpanAttribute a;
  a.key = std::move(key);
  a.string_value = std::move(value);
  return a;
}

SpanAttribute SpanAttribute::integer(std::string key, int64_t value) {
  SpanAttribute a;
  a.key = std::move(key);
  a.type = Type::kInt;
  a.int_value = value;
  return a;
}

SpanAttribute SpanAttribute::real(std::string key, double value) {
  SpanAttribute a;
  a.key = std::move(key);
  a.type = Type::kDouble;
  a.double_value = value;
  return a;
}

SpanAttribute SpanAttribute::boolean(std::string key, bool value) {
  SpanAttribute a;
  a.key = std::move(key);
  a.type = Type::kBool;
  a.bool_value = value;
  return a;
}

void append_json_string(std::string_view text, std::string* out) {
  *out += '"';
  while (!text.empty()) {
    const auto c = static_cast<unsigned char>(text[0]);
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        *out += '\\';
        *out += static_cast<char>(c);
      } else if (c < 0x20 || c == 0x7f) {
        char esc[8];
        std::snprintf(esc, sizeof esc, "\\u%04x", c);
        *out += esc;
      } else {
        *out += static_cast<char>(c);
      }
      text.remove_prefix(1);
      continue;
    }
    const size_t n = utf8_sequence(text);
    if (n == 0) {
      *out += "\\ufffd";
      text.remove_prefix(1);
      continue;
    }
    out->append(text.substr(0, n));
    text.remove_prefix(n);
  }
  *out += '"';
}

void encode_otlp_json(const SpanSource& source, const std::vector<Span>& spans, std::string* out) {
  *out += "{\"resourceSpans\":[{\"resource\":{\"attributes\":";
  std::vector<SpanAttribute> resource{SpanAttribute::str("service.name", source.service_name)};
  if (!source.service_version.empty()) resource.push_back(SpanAttribute::str("service.version", source.service_version));
  resource.push_back(SpanAttribute::str("telemetry.sdk.language", "cpp"));
  resource.push_back(SpanAttribute::str("telemetry.sdk.name", source.scope_name));
  append_attributes(resource, out);
  *out += "},\"scopeSpans\":[{\"scope\":{\"name\":";
  append_json_string(source.scope_name, out);
  *out += ",\"version\":";
  append_json_string(source.scope_version, out);
  *out += "},\"spans\":[";
  bool first = true;
  for (const Span& s : spans) {
    if (!first) *out += ',';
    first = false;
    append_span(s, out);
  }
  *out += "]}]}]}";
}

}  // namespace pdr::proto
