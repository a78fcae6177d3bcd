// Fuzzes proto/trace_context and the OTLP/JSON string encoding: a client's traceparent and
// tracestate are untrusted bytes that pdrouter parses on every traced request and passes on to
// nodes. Properties: a traceparent accepted has non-zero ids and formats back to a version-00
// header that parses to the same context; a tracestate passed on is at most 512 printable bytes
// (no CR/LF: it becomes a header line); any bytes encoded as a JSON string end in a closing quote
// and hold no raw control character or byte that is not UTF-8.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/otlp_span.h"
#include "proto/trace_context.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view raw(reinterpret_cast<const char*>(data), size);
  pdr::proto::TraceParent p;
  if (pdr::proto::parse_traceparent(raw, &p)) {
    if (pdr::proto::is_zero(p.trace_id) || pdr::proto::is_zero(p.parent_id)) std::abort();
    const std::string again = pdr::proto::format_traceparent(p.trace_id, p.parent_id, p.flags);
    pdr::proto::TraceParent q;
    if (again.size() != pdr::proto::kTraceParentBytes || !pdr::proto::parse_traceparent(again, &q)) std::abort();
    if (q.trace_id != p.trace_id || q.parent_id != p.parent_id || q.flags != p.flags) std::abort();
  }
  const std::string_view state = pdr::proto::usable_tracestate(raw);
  if (state.size() > pdr::proto::kMaxTraceState) std::abort();
  for (const char c : state) {
    if (c < 0x20 || c > 0x7e) std::abort();
  }
  std::string json;
  pdr::proto::append_json_string(raw, &json);
  if (json.size() < 2 || json.front() != '"' || json.back() != '"') std::abort();
  for (size_t i = 0; i < json.size(); ++i) {
    const auto c = static_cast<unsigned char>(json[i]);
    if (c < 0x20) std::abort();
    if (c == 0xc0 || c == 0xc1 || c >= 0xf5) std::abort();  // never valid in UTF-8
  }
  return 0;
}
