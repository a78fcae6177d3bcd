// What the P/D request session (proxy_session.h) counts, for /metrics, and the proxy's page
// section: its state transitions and how requests ended, why requests were refused before any
// upstream work, each leg attempt's failures, retries and node ejections, the in-flight gauge, the
// request, time-to-first-byte and leg latencies, and what befalls it on the way: mid-stream
// error events, local prefill fallbacks, client disconnects, back-pressure pauses, client write
// stalls, request and prefill deadlines, discarded prefill bytes and held stream heads. What
// refuses a request before its session starts (admission.h, ProxyService's path and body checks)
// counts into the same refusals and in-flight gauge, and the one-node relay (one_node_relay.h)
// into the same pauses and stalls, so each has one total.
//
// A component with counters of its own declares them beside its code and writes their /metrics
// section there: in proxy/, node_endpoints_counters.h (/v1/models and profile fan-outs),
// one_node_counters.h, abort_requests_counters.h, admission_queue_counters.h,
// upstream_legs_counters.h (connection reuse), orphan_legs_counters.h and pd_phases.h; in
// router/routing/, pre_step_counters.h (Mooncake bootstrap queries), cache_routing_counters.h,
// decode_alone_counters.h, multi_turn_counters.h, session_affinity_counters.h and buffer_budget.h
// (limits.max_buffered_bytes). ProxyCounters holds one of each and write_proxy_metrics() calls
// their writers in the page's order.
//
// Written by every HTTP worker with relaxed atomics (each counter is independent), read by the
// /metrics handler on any worker.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "proto/base/latency_histogram.h"
#include "router/proxy/abort_requests_counters.h"
#include "router/proxy/admission_queue_counters.h"
#include "router/routing/buffer_budget.h"
#include "router/routing/cache_routing_counters.h"
#include "router/routing/decode_alone_counters.h"
#include "router/routing/multi_turn_counters.h"
#include "router/routing/session_affinity_counters.h"
#include "router/proxy/node_endpoints_counters.h"
#include "router/proxy/one_node_counters.h"
#include "router/proxy/orphan_legs_counters.h"
#include "router/proxy/pd_phases.h"
#include "router/routing/pre_step_counters.h"
#include "router/proxy/upstream_legs_counters.h"

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::routing {
class ConversationCache;
}  // namespace pdr::router::routing

namespace pdr::router::proxy {

// The proxy names routing's types and calls (router/routing/: pairing, the cache lookup, the
// counters above...) unqualified, as it did when they were proxy/ files.
using namespace pdr::router::routing;

// docs/design/request-flow.md, "The request state machine".
enum class RequestState : uint8_t {
  kAccepted,     // parsed and admitted (below the concurrency limit)
  kPaired,       // a (prefill, decode) pair chosen and both legs built
  kPrefillSent,  // the prefill leg is in flight (concurrent dialects: decode too)
  kPrefillDone,  // the prefill answered 2xx (serial dialects: decode completed from it)
  kDecodeSent,   // the decode leg is in flight
  kStreaming,    // the decode's response head reached the client; body relayed as it arrives
  kDone,         // the client got a complete response (success or an upstream 4xx relayed)
  kFailed,       // the client got an error (502/503/504, or an error event mid-stream)
  kCancelled,    // the client went away; every open leg was closed
};
constexpr size_t kRequestStateCount = 9;
std::string_view to_string(RequestState state);  // "accepted", "paired", ...

// Why a request was refused before any upstream work.
enum class Refusal : uint8_t {
  kBadJson,          // 400
  kBadContentType,   // 415
  kTooBusy,          // 429 (limits.max_concurrent_requests)
  kNoPair,           // 503 (no compatible prefill/decode pair)
  kShuttingDown,     // 503 (draining)
  kBadPath,          // 405 on a P/D path; 400 for a request path that cannot be normalised
  kBadParameter,     // 400: a parameter pdrouter knows vLLM refuses or P/D cannot serve (max_tokens < 1, n != 1)
  kMemoryBudget,     // 503: the body would take buffered bytes over limits.max_buffered_bytes
  kPassThroughDenied,  // 403/404: an unknown path pass-through may not relay (pass_through.h)
  kQueueFull,        // 429: the admission queue holds limits.max_queued_requests / _bytes already
  kQueueTimeout,     // 503: waited limits.queue_timeout_ms in the admission queue
  kBadSlo,           // 400: a bad x-slo-ttft-ms / x-slo-tpot-ms (router/routing/slo_headers.h)
  kSloUnmet,         // 503: no candidate predicted within the request's SLO, shed (router/routing/slo_gate.h)
};
constexpr size_t kRefusalCount = 13;
std::string_view to_string(Refusal refusal);

// Why one leg attempt failed (each failed attempt counts once, retried or not).
enum class LegFailure : uint8_t {
  kConnect,          // connect refused / unreachable / bad address
  kTimeout,          // connect, prefill, first-byte or stream-idle timeout
  kConnectionLost,   // EOF / reset before the response was complete
  kBadResponse,      // unparsable HTTP, or a prefill response that is not usable JSON
  kStatus5xx,        // the node answered 5xx
  kStatus4xx,        // the node answered 4xx (relayed to the client, never retried)
  kBootstrap,        // Mooncake bootstrap /query failed
  kLocalResources,   // pdrouter could not open a socket (EMFILE...): 503, never retried nor blamed on the node
};
constexpr size_t kLegFailureCount = 8;
std::string_view to_string(LegFailure failure);

enum class Leg : uint8_t { kPrefill, kDecode };
std::string_view to_string(Leg leg);

struct ProxyCounters {
  using Counter = std::atomic<uint64_t>;
  std::array<std::array<Counter, kRequestStateCount>, kRequestStateCount> transitions{};
  std::array<Counter, kRefusalCount> refusals{};
  std::array<std::array<Counter, kLegFailureCount>, 2> leg_failures{};  // [Leg][LegFailure]
  std::array<Counter, 2> retries{};                                     // [Leg]
  std::array<Counter, 2> ejections{};                                   // [Leg] (router/routing/ejection.h)
  std::atomic<int64_t> in_flight{0};                                    // gauge
  Counter mid_stream_errors{0};       // streams ended with an error event
  Counter local_prefill_fallbacks{0}; // prefill exported no KV: decode sent as a plain request
  Counter client_disconnects{0};      // cancelled because the client went away
  BootstrapQueryCounters bootstrap_queries;  // Mooncake's pre-step (router/routing/pre_step.h)
  ModelsCounters models;                 // GET /v1/models (node_endpoints.h)
  CacheRoutingCounters cache_routing;    // cache-aware routing (router/routing/cache_routing.h)
  CacheTokenizeCounters cache_tokenize{};  // node tokenization for the lookup (router/routing/cache_tokenize.h)
  MultiTurnCounters multi_turn;          // multi-turn KV reuse (router/routing/multi_turn.h)
  DecodeAloneCounters decode_alone{};    // requests sent to their decode alone (router/routing/decode_alone.h)
  AbortRequestsCounters abort_requests{};  // aborts sent to tokens-only nodes (abort_requests.h)
  // The conversation cache whose size the multi-turn section shows; null: none (zeros).
  const ConversationCache* conversations = nullptr;
  SessionAffinityCounters session_affinity;  // session affinity (router/routing/session_affinity.h)
  const SessionTable* sessions = nullptr;    // its bindings, for the section's figures; null: zeros
  ProfileFanoutCounter profile_fanouts{0};  // profile fan-outs (node_endpoints.h)
  Counter backpressure_pauses{0};     // decode reads paused because the client was slow
  UpstreamLegCounters upstream_legs;  // legs answered, by connection reuse (upstream_legs_counters.h)
  Counter client_write_stalls{0};     // streams aborted: the client stopped reading (timeouts.client_write_ms)
  Counter request_deadlines{0};       // requests ended by timeouts.request_ms
  Counter prefill_deadlines{0};       // prefill legs closed by timeouts.prefill_ms (whole leg)
  OrphanLegCounters orphan_legs;      // orphaned prefill legs (orphan_legs.h)
  Counter prefill_bytes_discarded{0}; // prefill answer bytes read and dropped unbuffered
  Counter held_stream_heads{0};       // decode SSE heads held until the first event (retry still possible)
  // limits.max_buffered_bytes, taken by bodies and buffered answers (router/routing/buffer_budget.h).
  BufferBudget buffered;
  // Latencies (proto/base/latency_histogram.h): the whole P/D request by outcome [done, failed,
  // cancelled] (arrival = request head parsed, to its end), arrival to the first byte of the
  // answer's body sent to the client, and each leg attempt by [Leg] (sent to its answer complete
  // or its failure, counted in leg_failures).
  std::array<LatencyHistogram, 3> request_duration{};
  LatencyHistogram time_to_first_byte;
  std::array<LatencyHistogram, 2> leg_duration{};
  // The P/D phases per dialect: prefill, handover, decode (pd_phases.h).
  PdPhaseHistograms pd_phases{};
  OneNodeCounters one_node{};  // the one-node endpoints (one_node_relay.h)
  AdmissionQueueCounters admission_queue{};  // requests waiting for a slot (admission_queue.h)

  void transition(RequestState from, RequestState to) {
    transitions[static_cast<size_t>(from)][static_cast<size_t>(to)].fetch_add(1, std::memory_order_relaxed);
  }
  void refuse(Refusal r) { refusals[static_cast<size_t>(r)].fetch_add(1, std::memory_order_relaxed); }
  void leg_failed(Leg leg, LegFailure f) {
    leg_failures[static_cast<size_t>(leg)][static_cast<size_t>(f)].fetch_add(1, std::memory_order_relaxed);
  }
  void retried(Leg leg) { retries[static_cast<size_t>(leg)].fetch_add(1, std::memory_order_relaxed); }
  void ejected(Leg leg) { ejections[static_cast<size_t>(leg)].fetch_add(1, std::memory_order_relaxed); }
  static void bump(Counter& c) { c.fetch_add(1, std::memory_order_relaxed); }
};

// The session's counters above as Prometheus families (pdrouter_request_transitions_total{from,to},
// ...), the components' sections through their own writers, in the page's order.
void write_proxy_metrics(MetricsWriter& out, const ProxyCounters& counters);

}  // namespace pdr::router::proxy
