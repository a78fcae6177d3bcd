// GET /health_generate: a deep health probe. One tiny generation goes through one real pair,
// chosen as a client request's would be: pdrouter sends itself (its own client listener, over
// loopback) POST /v1/completions {"prompt": "ping", "max_tokens": 1, "stream": false}, which
// takes the whole P/D path (pairing and policies, the dialect's legs, retries, the KV transfer).
//   200 {"status":"ok","latency_ms":N}   that request succeeded
//   503 OpenAI-style error               it failed; the message and code name the failing leg
//                                        ("prefill_failed", "decode_timeout", ... as the P/D
//                                        answer said), or why there was no pair
//   503 no_pair at once                  no compatible pair is up: nothing is sent
// The probe is bounded by kHealthGenerateDeadline (then 503 health_generate_timeout, and the
// inner request is cancelled, which closes its legs). The caller's Authorization goes with it.
//
// Not admin-only (it is a probe for load balancers and Kubernetes), so it must not amplify load:
// per HTTP worker at most one probe is in flight (callers arriving meanwhile share its answer)
// and an answer is reused for kHealthGenerateReuse; so pdrouter sends at most one probe per
// worker per kHealthGenerateReuse however often it is called. Counted in
// pdrouter_health_generate_total{result} (ok, failed, no_pair, shared, reused).
//
// The inner request is an ordinary P/D request: it counts in pdrouter's request metrics and
// against limits.max_concurrent_requests (a saturated router answers the probe 503 too_busy).
//
// Worker thread only: one HealthGenerate per worker, created and destroyed on it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "router/http/http_message.h"
#include "router/http/response_writer.h"
#include "router/proxy/proxy_shared.h"

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::proxy {

inline constexpr std::chrono::milliseconds kHealthGenerateDeadline{30000};
inline constexpr std::chrono::milliseconds kHealthGenerateReuse{1000};

struct HealthGenerateCounters {
  std::atomic<uint64_t> ok{0}, failed{0}, no_pair{0}, shared{0}, reused{0};
};
HealthGenerateCounters& health_generate_counters();  // one per process

class HealthGenerate {
 public:
  HealthGenerate() = default;
  ~HealthGenerate();
  HealthGenerate(const HealthGenerate&) = delete;
  HealthGenerate& operator=(const HealthGenerate&) = delete;

  // `own_port`: the client listener's bound port (the probe goes to it over loopback).
  void serve(WorkerContext& worker, const http::Request& request, http::ResponseWriter writer, uint16_t own_port);

  struct Probe;  // one probe in flight (health_generate.cc)

 private:
  std::shared_ptr<Probe> in_flight_;
  std::chrono::steady_clock::time_point answered_at_{};
  int last_status_ = 0;  // 0: no answer to reuse
  std::string last_body_;
};

void write_health_generate_metrics(MetricsWriter& out);

}  // namespace pdr::router::proxy
