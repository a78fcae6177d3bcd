// W3C Trace Context (https://www.w3.org/TR/trace-context/): the traceparent and tracestate
// headers, parsed and written without I/O. pdrouter reads a client's context, starts its own
// spans under it and sends each leg a traceparent naming that leg's span (router/tracing/).
//
// traceparent: "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>", lower-case hex. Version
// 00 is parsed strictly (exactly 55 bytes); a higher version is read for its first four fields if
// it is at least that long and continues with '-' (the spec's forward compatibility); version ff,
// an all-zero trace-id or parent-id, upper-case hex or any other shape is invalid (then the
// header is ignored, and tracestate with it).
// tracestate: kept as sent when it is at most kMaxTraceState bytes of printable ASCII with at
// most 32 list members, else dropped (the spec allows dropping it whole).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pdr::proto {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

struct TraceParent {
  TraceId trace_id{};
  SpanId parent_id{};
  uint8_t flags = 0;
  bool sampled() const { return (flags & 0x01) != 0; }
};

inline constexpr size_t kTraceParentBytes = 55;
inline constexpr size_t kMaxTraceState = 512;

// True and *out set for a valid header value (surrounding spaces and tabs are ignored).
bool parse_traceparent(std::string_view text, TraceParent* out);
// "00-...-...-.." (version 00, 55 bytes) naming `span` as the parent.
std::string format_traceparent(const TraceId& trace, const SpanId& span, uint8_t flags);
// The value to pass on, or "" when it must be dropped (see above).
std::string_view usable_tracestate(std::string_view text);

bool is_zero(const TraceId& id);
bool is_zero(const SpanId& id);
// Lower-case hex of the bytes (32 or 16 characters), as OTLP/JSON and traceparent write ids.
std::string to_hex(const TraceId& id);
std::string to_hex(const SpanId& id);

}  // namespace pdr::proto
