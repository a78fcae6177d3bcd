#include "router/routing/slo_headers.h"

#include <fmt/format.h>

namespace pdr::router::routing {

Status parse_slo_value(std::string_view header, std::string_view value, uint32_t max_ms, uint32_t* out) {
  // Digits only: no sign, no spaces, no fraction; a leading zero is fine ("0100"), the value is not.
  uint64_t n = 0;
  bool ok = !value.empty() && value.size() <= 10;
  for (char c : value) {
    if (c < '0' || c > '9') {
      ok = false;
      break;
    }
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  if (!ok || n == 0 || n > max_ms) {
    return Status(StatusCode::kInvalidValue,
                  fmt::format("{} must be a whole number of milliseconds from 1 to {}", header, max_ms));
  }
  *out = static_cast<uint32_t>(n);
  return Status::ok();
}

Status request_slo(const http::Request& request, const config::Topology::Policies::PredictedLatency& defaults,
                   RequestSlo* out) {
  static_assert(kSloTtftHeader.size() == kSloTpotHeader.size());
  RequestSlo slo{defaults.slo_ttft_ms, defaults.slo_tpot_ms};
  bool seen_ttft = false, seen_tpot = false;
  // One pass; a length compare skips almost every header before any case-insensitive compare
  // (this runs for every P/D request).
  for (const http::Header& h : request.headers) {
    if (h.name.size() != kSloTtftHeader.size()) continue;
    const bool ttft = http::iequals(h.name, kSloTtftHeader);
    if (!ttft && !http::iequals(h.name, kSloTpotHeader)) continue;
    const std::string_view name = ttft ? kSloTtftHeader : kSloTpotHeader;
    bool& seen = ttft ? seen_ttft : seen_tpot;
    if (seen) return Status(StatusCode::kInvalidValue, fmt::format("{} was sent more than once", name));
    seen = true;
    Status s = parse_slo_value(name, h.value, ttft ? kMaxSloTtftMs : kMaxSloTpotMs, ttft ? &slo.ttft_ms : &slo.tpot_ms);
    if (!s.is_ok()) return s;
  }
  *out = slo;
  return Status::ok();
}

}  // namespace pdr::router::routing
