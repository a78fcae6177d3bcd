// The last routing decisions of the predicted_latency policy, for GET /debug/route (admin key):
// each with the request id, every candidate's figures and prediction, the choice and why. A
// bounded ring (kRouteDecisions entries; the oldest is overwritten), so memory stays fixed
// whatever the request rate. Also counts whether the node holding most of a prompt was chosen or
// passed over for load (pdrouter_routing_cache_best_total) and how far predicted TTFTs were from
// the observed ones (pdrouter_routing_ttft_prediction_error_seconds).
//
//   GET /debug/route[?limit=N]  200 {"capacity": 256, "recorded": total so far,
//       "decisions": [newest first: {"request_id", "unix_ms", "prefill": LEG, "decode": LEG,
//       "decode_alone": null, or {"reason": "prefill_busy", "predicted_seconds"} when the decode
//       computed the prompt itself because the prefills were busy (decode_alone.h)}]}
//   LEG: null when the leg's policy predicts nothing, else {"chosen": "host:port",
//       "reason": text, "cache_best": "host:port"|null, "candidates": [{"node", "outstanding",
//       "weight", "queued_prefill_tokens", "decode_sequences", "kv_tokens",
//       "prefill_tokens_per_second" (0: no estimate), "decode_step_seconds" (0: none),
//       "uncached_tokens", "predicted_seconds", "kv_full"}]}
//   400 bad limit (not a decimal 1..capacity, or another parameter).
//
// Thread-safe: record() and render() take one mutex (held to copy one entry in or the ring
// out); the counters are relaxed atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "router/http/http_message.h"
#include "router/policies/policy.h"

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::routing {

inline constexpr size_t kRouteDecisions = 256;

struct RouteDecision {
  std::string request_id;
  int64_t unix_ms = 0;
  RouteExplanation explanation;
};

// Why `leg` chose what it chose, in words ("least predicted TTFT ...; the node holding most of
// the prompt, X, predicted ..., skipped for load").
std::string explain_reason(const LegExplanation& leg, PolicyLeg which);

class RouteDecisionLog {
 public:
  // Keeps `d` (the oldest goes once full) and counts its cache-best outcome.
  void record(RouteDecision d);
  // A prefill leg's observed TTFT against its prediction (seconds; the error is observed - predicted).
  void observe_ttft(double predicted_seconds, double observed_seconds);

  http::Response render(std::string_view query) const;

  // Bucket upper bounds of the prediction-error histogram, seconds (absolute error).
  static constexpr std::array<double, 8> kErrorBuckets{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5};
  struct Counters {
    std::atomic<uint64_t> cache_best_chosen{0};
    std::atomic<uint64_t> cache_best_skipped{0};
    std::array<std::atomic<uint64_t>, kErrorBuckets.size()> error_buckets{};  // not cumulative
    std::atomic<uint64_t> error_count{0};
    std::atomic<uint64_t> error_sum_micros{0};
  };
  const Counters& counters() const { return counters_; }
  // pdrouter_routing_cache_best_total, pdrouter_routing_ttft_prediction_error_seconds.
  void write_metrics(MetricsWriter& out) const;

 private:
  mutable std::mutex mutex_;
  std::vector<RouteDecision> ring_;  // grows to kRouteDecisions, then wraps
  size_t next_ = 0;
  uint64_t recorded_ = 0;
  Counters counters_;
};

}  // namespace pdr::router::routing
