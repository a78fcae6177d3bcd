#include "router/routing/route_decisions.h"

#include <charconv>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "proto/base/metrics_writer.h"
#include "router/http/json_error.h"
#include "router/routing/decode_alone.h"

namespace pdr::router::routing {

std::string explain_reason(const LegExplanation& leg, PolicyLeg which) {
  if (!leg.filled || leg.rows.empty()) return {};
  const char* what = which == PolicyLeg::kPrefill ? "TTFT + fleet work" : "time per output token";
  const LegExplanation::Row& chosen = leg.rows[leg.chosen];
  if (leg.preferred) {
    // Not the policy's choice: say whose, and what it is predicted to cost.
    return fmt::format("the session's or conversation's node (predicted {:.6f} s; the policy's scores for the {} "
                       "candidate{} are listed)",
                       chosen.predicted_seconds, leg.rows.size(), leg.rows.size() == 1 ? "" : "s") +
           (chosen.kv_full ? "; it would exceed its KV capacity" : "");
  }
  std::string out = fmt::format("least predicted {} ({:.6f} s of {} candidate{})", what, chosen.score,
                                leg.rows.size(), leg.rows.size() == 1 ? "" : "s");
  if (leg.cache_best) {
    const LegExplanation::Row& best = leg.rows[*leg.cache_best];
    if (*leg.cache_best == leg.chosen) {
      out += "; it holds the most of the prompt";
    } else {
      out += fmt::format("; {} holds the most of the prompt but was skipped for load (predicted {:.6f} s)", best.key,
                         best.score);
    }
  }
  if (chosen.kv_full) out += "; every candidate would exceed its KV capacity";
  return out;
}

void RouteDecisionLog::record(RouteDecision d) {
  const LegExplanation& prefill = d.explanation.prefill;
  if (prefill.filled && prefill.cache_best && !prefill.preferred) {  // the policy's choices only
    (*prefill.cache_best == prefill.chosen ? counters_.cache_best_chosen : counters_.cache_best_skipped)
        .fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.size() < kRouteDecisions) {
    ring_.push_back(std::move(d));
  } else {
    ring_[next_] = std::move(d);
  }
  next_ = (next_ + 1) % kRouteDecisions;
  ++recorded_;
}

void RouteDecisionLog::observe_ttft(double predicted_seconds, double observed_seconds) {
  const double error = std::fabs(observed_seconds - predicted_seconds);
  if (!std::isfinite(error)) return;
  size_t b = 0;
  while (b < kErrorBuckets.size() && error > kErrorBuckets[b]) ++b;
  if (b < kErrorBuckets.size()) counters_.error_buckets[b].fetch_add(1, std::memory_order_relaxed);
  counters_.error_count.fetch_add(1, std::memory_order_relaxed);
  counters_.error_sum_micros.fetch_add(static_cast<uint64_t>(std::min(error, 1e9) * 1e6), std::memory_order_relaxed);
}

namespace {

nlohmann::json leg_json(const LegExplanation& leg, PolicyLeg which) {
  if (!leg.filled || leg.rows.empty()) return nlohmann::json();
  nlohmann::json rows = nlohmann::json::array();
  for (const LegExplanation::Row& r : leg.rows) {
    rows.push_back({{"node", r.key},
                    {"outstanding", r.outstanding},
                    {"weight", r.weight},
                    {"queued_prefill_tokens", r.load.queued_prefill_tokens},
                    {"decode_sequences", r.load.decode_sequences},
                    {"kv_tokens", r.load.kv_tokens},
                    {"prefill_tokens_per_second", r.load.prefill_tokens_per_second},
                    {"decode_step_seconds", r.load.decode_step_seconds},
                    {"uncached_tokens", r.uncached_tokens},
                    {"predicted_seconds", r.predicted_seconds},
                    {"score", r.score},
                    {"kv_full", r.kv_full}});
  }
  return {{"chosen", leg.rows[leg.chosen].key},
          {"reason", explain_reason(leg, which)},
          {"cache_best", leg.cache_best ? nlohmann::json(leg.rows[*leg.cache_best].key) : nlohmann::json()},
          {"preferred", leg.preferred},
          {"candidates", std::move(rows)}};
}

// ?limit=N (1..kRouteDecisions); empty query: all.
bool parse_limit(std::string_view query, size_t* limit) {
  *limit = kRouteDecisions;
  if (query.empty()) return true;
  constexpr std::string_view kKey = "limit=";
  if (query.substr(0, kKey.size()) != kKey) return false;
  const std::string_view digits = query.substr(kKey.size());
  size_t n = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc() || end != digits.data() + digits.size() || n == 0 || n > kRouteDecisions) return false;
  *limit = n;
  return true;
}

}  // namespace

http::Response RouteDecisionLog::render(std::string_view query) const {
  size_t limit = 0;
  if (!parse_limit(query, &limit)) {
    return http::error_response(400, fmt::format("the only parameter is limit=N, N from 1 to {}", kRouteDecisions),
                                "invalid_request_error", "bad_limit");
  }
  nlohmann::json decisions = nlohmann::json::array();
  uint64_t recorded = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    recorded = recorded_;
    const size_t n = ring_.size();
    for (size_t k = 0; k < std::min(n, limit); ++k) {
      const RouteDecision& d = ring_[(next_ + n - 1 - k) % n];  // newest first
      decisions.push_back({{"request_id", d.request_id},
                           {"unix_ms", d.unix_ms},
                           {"prefill", leg_json(d.explanation.prefill, PolicyLeg::kPrefill)},
                           {"decode", leg_json(d.explanation.decode, PolicyLeg::kDecode)},
                           {"decode_alone", d.explanation.decode_alone_seconds
                                                ? nlohmann::json{{"reason", to_string(DecodeAloneReason::kPrefillBusy)},
                                                                 {"predicted_seconds", *d.explanation.decode_alone_seconds}}
                                                : nlohmann::json()}});
    }
  }
  const nlohmann::json doc = {{"capacity", kRouteDecisions}, {"recorded", recorded}, {"decisions", std::move(decisions)}};
  return http::Response::json(200, doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

void RouteDecisionLog::write_metrics(MetricsWriter& out) const {
  constexpr std::string_view kHelp =
      "Prefill legs routed by predicted_latency with a node holding the most of the prompt, by whether that "
      "node was chosen or passed over because its predicted latency was worse";
  out.counter("pdrouter_routing_cache_best_total", kHelp,
              static_cast<double>(counters_.cache_best_chosen.load(std::memory_order_relaxed)),
              {{"outcome", "chosen"}});
  out.counter("pdrouter_routing_cache_best_total", kHelp,
              static_cast<double>(counters_.cache_best_skipped.load(std::memory_order_relaxed)),
              {{"outcome", "skipped_for_load"}});
  std::array<uint64_t, kErrorBuckets.size()> cumulative{};
  uint64_t running = 0;
  for (size_t b = 0; b < kErrorBuckets.size(); ++b) {
    running += counters_.error_buckets[b].load(std::memory_order_relaxed);
    cumulative[b] = running;
  }
  const uint64_t count = std::max(running, counters_.error_count.load(std::memory_order_relaxed));
  out.histogram("pdrouter_routing_ttft_prediction_error_seconds",
                "Absolute difference between a prefill leg's predicted TTFT (predicted_latency) and the time its "
                "answer took",
                kErrorBuckets, cumulative,
                static_cast<double>(counters_.error_sum_micros.load(std::memory_order_relaxed)) * 1e-6, count);
}

}  // namespace pdr::router::routing
