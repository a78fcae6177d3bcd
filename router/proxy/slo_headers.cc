#include "router/proxy/slo_headers.h"

#include <fmt/format.h>

namespace pdr::router::proxy {

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

namespace {

// The header's single value; nullopt when absent; an error when sent more than once.
Status single_header(const http::Request& request, std::string_view name, std::optional<std::string_view>* out) {
  out->reset();
  for (const http::Header& h : request.headers) {
    if (!http::iequals(h.name, name)) continue;
    if (out->has_value()) return Status(StatusCode::kInvalidValue, fmt::format("{} was sent more than once", name));
    *out = std::string_view(h.value);
  }
  return Status::ok();
}

}  // namespace

Status request_slo(const http::Request& request, const config::Topology::Policies::PredictedLatency& defaults,
                   RequestSlo* out) {
  RequestSlo slo{defaults.slo_ttft_ms, defaults.slo_tpot_ms};
  std::optional<std::string_view> value;
  if (Status s = single_header(request, kSloTtftHeader, &value); !s.is_ok()) return s;
  if (value) {
    if (Status s = parse_slo_value(kSloTtftHeader, *value, kMaxSloTtftMs, &slo.ttft_ms); !s.is_ok()) return s;
  }
  if (Status s = single_header(request, kSloTpotHeader, &value); !s.is_ok()) return s;
  if (value) {
    if (Status s = parse_slo_value(kSloTpotHeader, *value, kMaxSloTpotMs, &slo.tpot_ms); !s.is_ok()) return s;
  }
  *out = slo;
  return Status::ok();
}

}  // namespace pdr::router::proxy
