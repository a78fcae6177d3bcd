#include "router/proxy/proxy_counters.h"

#include <string>
#include <utility>

#include "proto/base/metrics_writer.h"

namespace pdr::router::proxy {

std::string_view to_string(RequestState state) {
  switch (state) {
    case RequestState::kAccepted: return "accepted";
    case RequestState::kPaired: return "paired";
    case RequestState::kPrefillSent: return "prefill_sent";
    case RequestState::kPrefillDone: return "prefill_done";
    case RequestState::kDecodeSent: return "decode_sent";
    case RequestState::kStreaming: return "streaming";
    case RequestState::kDone: return "done";
    case RequestState::kFailed: return "failed";
    case RequestState::kCancelled: return "cancelled";
  }
  return "unknown";
}

std::string_view to_string(Refusal refusal) {
  switch (refusal) {
    case Refusal::kBadJson: return "bad_json";
    case Refusal::kBadContentType: return "bad_content_type";
    case Refusal::kTooBusy: return "too_busy";
    case Refusal::kNoPair: return "no_pair";
    case Refusal::kShuttingDown: return "shutting_down";
    case Refusal::kBadPath: return "bad_path";
    case Refusal::kBadParameter: return "bad_parameter";
    case Refusal::kMemoryBudget: return "memory_budget";
    case Refusal::kPassThroughDenied: return "pass_through_denied";
    case Refusal::kQueueFull: return "queue_full";
    case Refusal::kQueueTimeout: return "queue_timeout";
    case Refusal::kBadSlo: return "bad_slo";
    case Refusal::kSloUnmet: return "slo_unmet";
  }
  return "unknown";
}

std::string_view to_string(LegFailure failure) {
  switch (failure) {
    case LegFailure::kConnect: return "connect";
    case LegFailure::kTimeout: return "timeout";
    case LegFailure::kConnectionLost: return "connection_lost";
    case LegFailure::kBadResponse: return "bad_response";
    case LegFailure::kStatus5xx: return "status_5xx";
    case LegFailure::kStatus4xx: return "status_4xx";
    case LegFailure::kBootstrap: return "bootstrap";
    case LegFailure::kLocalResources: return "local_resources";
  }
  return "unknown";
}

std::string_view to_string(Leg leg) { return leg == Leg::kPrefill ? "prefill" : "decode"; }

namespace {

using S = RequestState;
// The transitions the state machine takes (proxy_session.cc); exported even at zero so
// dashboards see stable series (any other transition is exported once it happened).
constexpr std::pair<S, S> kLegalTransitions[] = {
    {S::kAccepted, S::kPaired},        {S::kAccepted, S::kFailed},
    {S::kAccepted, S::kCancelled},     {S::kPaired, S::kPrefillSent},
    {S::kPaired, S::kFailed},          {S::kPaired, S::kCancelled},
    {S::kPaired, S::kDecodeSent},  // conditional disaggregation: the decode alone
    {S::kPrefillSent, S::kPrefillDone}, {S::kPrefillSent, S::kDecodeSent},
    {S::kPrefillSent, S::kPaired},     {S::kPrefillSent, S::kDone},
    {S::kPrefillSent, S::kFailed},     {S::kPrefillSent, S::kCancelled},
    {S::kPrefillDone, S::kDecodeSent}, {S::kPrefillDone, S::kFailed},
    {S::kPrefillDone, S::kPaired},
    {S::kPrefillDone, S::kCancelled},  {S::kDecodeSent, S::kStreaming},
    {S::kDecodeSent, S::kDecodeSent},  {S::kDecodeSent, S::kPaired},
    {S::kDecodeSent, S::kDone},        {S::kDecodeSent, S::kFailed},
    {S::kDecodeSent, S::kCancelled},   {S::kStreaming, S::kDone},
    {S::kStreaming, S::kFailed},       {S::kStreaming, S::kCancelled},
};

double value(const std::atomic<uint64_t>& c) { return static_cast<double>(c.load(std::memory_order_relaxed)); }

void write_histogram(MetricsWriter& out, std::string_view name, std::string_view help, const LatencyHistogram& h,
                     MetricsWriter::Labels labels = {}) {
  const LatencyHistogram::Snapshot s = h.snapshot();
  out.histogram(name, help, LatencyHistogram::kBoundSeconds, s.cumulative, s.sum_seconds, s.count, std::move(labels));
}

}  // namespace

void write_proxy_metrics(MetricsWriter& out, const ProxyCounters& c) {
  auto legal = [](size_t from, size_t to) {
    for (const auto& [f, t] : kLegalTransitions) {
      if (static_cast<size_t>(f) == from && static_cast<size_t>(t) == to) return true;
    }
    return false;
  };
  for (size_t f = 0; f < kRequestStateCount; ++f) {
    for (size_t t = 0; t < kRequestStateCount; ++t) {
      const auto from = static_cast<S>(f), to = static_cast<S>(t);
      if (!legal(f, t) && c.transitions[f][t].load(std::memory_order_relaxed) == 0) continue;
      out.counter("pdrouter_request_transitions_total",
                "P/D request state transitions (docs/design/request-flow.md state machine)",
                value(c.transitions[static_cast<size_t>(from)][static_cast<size_t>(to)]),
                  {{"from", std::string(to_string(from))}, {"to", std::string(to_string(to))}});
    }
  }
  for (S end : {S::kDone, S::kFailed, S::kCancelled}) {
    uint64_t total = 0;
    for (size_t from = 0; from < kRequestStateCount; ++from) {
      total += c.transitions[from][static_cast<size_t>(end)].load(std::memory_order_relaxed);
    }
    out.counter("pdrouter_requests_total", "P/D requests by final state", static_cast<double>(total),
                {{"outcome", std::string(to_string(end))}});
  }
  {
    size_t i = 0;
    for (S end : {S::kDone, S::kFailed, S::kCancelled}) {
      write_histogram(out, "pdrouter_request_duration_seconds",
                      "P/D requests from their arrival (head parsed) to their end (answer handed to the client, "
                      "failure or cancel), by final state",
                      c.request_duration[i++], {{"outcome", std::string(to_string(end))}});
    }
  }
  write_histogram(out, "pdrouter_time_to_first_byte_seconds",
                  "P/D requests from their arrival to the first byte of the answer's body sent to the client "
                  "(a stream's first data event; a JSON answer when it is written)",
                  c.time_to_first_byte);
  for (Leg leg : {Leg::kPrefill, Leg::kDecode}) {
    write_histogram(out, "pdrouter_leg_duration_seconds",
                    "Upstream leg attempts from the request sent to the answer complete or the leg failing, by leg",
                    c.leg_duration[static_cast<size_t>(leg)], {{"leg", std::string(to_string(leg))}});
  }
  write_pd_phase_metrics(out, c.pd_phases);
  for (size_t r = 0; r < kRefusalCount; ++r) {
    out.counter("pdrouter_requests_refused_total", "Requests refused before any upstream work, by reason",
                value(c.refusals[r]), {{"reason", std::string(to_string(static_cast<Refusal>(r)))}});
  }
  for (Leg leg : {Leg::kPrefill, Leg::kDecode}) {
    for (size_t f = 0; f < kLegFailureCount; ++f) {
      out.counter("pdrouter_leg_failures_total", "Failed upstream leg attempts, by leg and cause",
                  value(c.leg_failures[static_cast<size_t>(leg)][f]),
                  {{"leg", std::string(to_string(leg))},
                   {"cause", std::string(to_string(static_cast<LegFailure>(f)))}});
    }
    out.counter("pdrouter_leg_retries_total", "Leg attempts retried on another node",
                value(c.retries[static_cast<size_t>(leg)]), {{"leg", std::string(to_string(leg))}});
    out.counter("pdrouter_node_ejections_total",
                "Nodes skipped for a while after legs in a row could not connect to them, by role",
                value(c.ejections[static_cast<size_t>(leg)]), {{"role", std::string(to_string(leg))}});
  }
  out.gauge("pdrouter_requests_in_flight", "Client requests (P/D and one-node) admitted and not yet finished",
            static_cast<double>(c.in_flight.load(std::memory_order_relaxed)));
  out.counter("pdrouter_stream_errors_total", "Responses ended with an OpenAI-style error event mid-stream",
              value(c.mid_stream_errors));
  out.counter("pdrouter_local_prefill_fallbacks_total",
              "Prefills that exported no KV (e.g. EOS on the first token): decode sent as a plain request",
              value(c.local_prefill_fallbacks));
  out.counter("pdrouter_client_disconnects_total", "Requests cancelled because the client went away",
              value(c.client_disconnects));
  write_bootstrap_query_metrics(out, c.bootstrap_queries);
  write_models_metrics(out, c.models);
  write_cache_routing_metrics(out, c.cache_routing);
  write_cache_tokenize_metrics(out, c.cache_tokenize);
  write_decode_alone_metrics(out, c.decode_alone);
  write_multi_turn_metrics(out, c.multi_turn, c.conversations);
  write_session_affinity_metrics(out, c.session_affinity, c.sessions);
  write_one_node_metrics(out, c.one_node);
  write_admission_queue_metrics(out, c.admission_queue);
  write_abort_requests_metrics(out, c.abort_requests);
  write_profile_fanout_metrics(out, c.profile_fanouts);
  write_upstream_leg_metrics(out, c.upstream_legs);
  out.counter("pdrouter_backpressure_pauses_total", "Decode reads paused because the client read slowly",
              value(c.backpressure_pauses));
  out.counter("pdrouter_client_write_stalls_total",
              "Streams aborted (both legs closed) because the client read nothing for timeouts.client_write_ms",
              value(c.client_write_stalls));
  out.counter("pdrouter_request_deadlines_total", "Requests ended by timeouts.request_ms",
              value(c.request_deadlines));
  out.counter("pdrouter_prefill_deadlines_total", "Prefill legs closed at timeouts.prefill_ms (whole-leg deadline)",
              value(c.prefill_deadlines));
  write_orphan_leg_metrics(out, c.orphan_legs);
  out.counter("pdrouter_prefill_bytes_discarded_total",
              "Prefill answer bytes read and dropped without buffering (answers nobody needs)",
              value(c.prefill_bytes_discarded));
  out.counter("pdrouter_held_stream_heads_total",
              "Decode stream heads held back until the first event, so a silent decode can still be retried",
              value(c.held_stream_heads));
  write_buffer_budget_metrics(out, c.buffered);
}

}  // namespace pdr::router::proxy
