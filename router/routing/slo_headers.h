// Per-request latency objectives: `x-slo-ttft-ms` (time to first token) and `x-slo-tpot-ms` (time
// per output token), in whole milliseconds, as llm-d's inference scheduler reads them; read only
// when policies.prefill or policies.decode is predicted_latency (ProxyService::admit). Absent
// headers take the topology's default (policies.predicted_latency.slo_ttft_ms / slo_tpot_ms; 0:
// none). A value that is not a decimal integer from 1 to the bound (kMaxSloTtftMs, kMaxSloTpotMs),
// or a header sent twice, is refused with 400 "bad_slo" before any upstream work (the caller
// counts it in pdrouter_requests_refused_total{reason="bad_slo"}).
// Pure; no allocation on success.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "discovery/config/topology.h"
#include "proto/base/status.h"
#include "router/http/http_message.h"

namespace pdr::router::routing {

inline constexpr std::string_view kSloTtftHeader = "x-slo-ttft-ms";
inline constexpr std::string_view kSloTpotHeader = "x-slo-tpot-ms";
inline constexpr uint32_t kMaxSloTtftMs = 3'600'000;  // an hour
inline constexpr uint32_t kMaxSloTpotMs = 60'000;     // a minute per token

struct RequestSlo {
  uint32_t ttft_ms = 0;  // 0: none
  uint32_t tpot_ms = 0;
  bool any() const { return ttft_ms != 0 || tpot_ms != 0; }
};

// One header's value: OK with *out set, or kInvalidValue naming the header and the bound.
Status parse_slo_value(std::string_view header, std::string_view value, uint32_t max_ms, uint32_t* out);

// The request's SLO from its headers and the topology's defaults.
Status request_slo(const http::Request& request, const config::Topology::Policies::PredictedLatency& defaults,
                   RequestSlo* out);

}  // namespace pdr::router::routing
