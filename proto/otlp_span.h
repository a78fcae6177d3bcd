// One finished span as OpenTelemetry's trace data model has it, and its OTLP/JSON encoding
// (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding): what router/tracing/
// records and exports over OTLP/HTTP. No I/O.
//
// The encoding follows the protobuf JSON mapping with OTLP's exceptions: trace and span ids as
// lower-case hex (not base64), enum values as integers, 64-bit integers (times, int attributes)
// as decimal strings, field names in lowerCamelCase.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "proto/trace_context.h"

namespace pdr::proto {

struct SpanAttribute {
  enum class Type : uint8_t { kString, kInt, kDouble, kBool };
  std::string key;
  Type type = Type::kString;
  std::string string_value;
  int64_t int_value = 0;
  double double_value = 0;
  bool bool_value = false;

  static SpanAttribute str(std::string key, std::string value);
  static SpanAttribute integer(std::string key, int64_t value);
  static SpanAttribute real(std::string key, double value);
  static SpanAttribute boolean(std::string key, bool value);
};

struct Span {
  // OTLP's Span.SpanKind.
  enum class Kind : uint8_t { kUnspecified = 0, kInternal = 1, kServer = 2, kClient = 3 };
  // OTLP's Status.StatusCode.
  enum class StatusCode : uint8_t { kUnset = 0, kOk = 1, kError = 2 };

  TraceId trace_id{};
  SpanId span_id{};
  SpanId parent_span_id{};  // all zero: a root span
  std::string trace_state;  // the W3C tracestate the span carries ("" = none)
  std::string name;
  Kind kind = Kind::kInternal;
  uint64_t start_unix_ns = 0;
  uint64_t end_unix_ns = 0;
  std::vector<SpanAttribute> attributes;
  StatusCode status = StatusCode::kUnset;
  std::string status_message;
};

// Who produced the spans: the resource's service.name (and service.version) and the
// instrumentation scope's name and version.
struct SpanSource {
  std::string service_name;
  std::string service_version;
  std::string scope_name;
  std::string scope_version;
};

// One ExportTraceServiceRequest holding `spans` under one resource and one scope, appended to *out.
void encode_otlp_json(const SpanSource& source, const std::vector<Span>& spans, std::string* out);

// A JSON string literal (quotes included) of `text`: control characters, quotes and backslashes
// escaped; bytes that are not valid UTF-8 become U+FFFD (OTLP/JSON must be valid UTF-8).
void append_json_string(std::string_view text, std::string* out);

}  // namespace pdr::proto
