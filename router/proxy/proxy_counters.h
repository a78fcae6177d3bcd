// What the P/D proxy counts, for /metrics: every request-state transition, why requests were
// refused or failed, retries, and the side work (bootstrap queries, model lists, profile fan-out).
// A component with counters of its own declares them beside its code and writes their /metrics
// section there (cache_routing_counters.h, multi_turn_counters.h, decode_alone_counters.h,
// one_node_counters.h, abort_requests_counters.h, orphan_legs_counters.h, pd_phases.h); ProxyCounters holds one of each
// and write_proxy_metrics() calls their writers in the page's order.
//
// Written by every HTTP worker with relaxed atomics (each counter is independent), read by the
// /metrics handler on any worker.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/latency_histogram.h"
#include "router/proxy/abort_requests_counters.h"
#include "router/proxy/cache_routing_counters.h"
#include "router/proxy/decode_alone_counters.h"
#include "router/proxy/multi_turn_counters.h"
#include "router/proxy/one_node_counters.h"
#include "router/proxy/orphan_legs_counters.h"
#include "router/proxy/pd_phases.h"

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::proxy {

class ConversationCache;

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
};
constexpr size_t kRefusalCount = 9;
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
  std::array<Counter, 2> ejections{};                                   // [Leg] (ejection.h)
  std::atomic<int64_t> in_flight{0};                                    // gauge
  Counter mid_stream_errors{0};       // streams ended with an error event
  Counter local_prefill_fallbacks{0}; // prefill exported no KV: decode sent as a plain request
  Counter client_disconnects{0};      // cancelled because the client went away
  Counter bootstrap_queries_ok{0};
  Counter bootstrap_queries_failed{0};
  Counter models_cache_hits{0};
  Counter models_fetches{0};
  CacheRoutingCounters cache_routing;    // cache-aware routing (cache_routing.h)
  CacheTokenizeCounters cache_tokenize{};  // node tokenization for the lookup (cache_tokenize.h)
  MultiTurnCounters multi_turn;          // multi-turn KV reuse (multi_turn.h)
  DecodeAloneCounters decode_alone{};    // requests sent to their decode alone (decode_alone.h)
  AbortRequestsCounters abort_requests{};  // aborts sent to tokens-only nodes (abort_requests.h)
  // The conversation cache whose size the multi-turn section shows; null: none (zeros).
  const ConversationCache* conversations = nullptr;
  Counter profile_fanouts{0};
  Counter backpressure_pauses{0};     // decode reads paused because the client was slow
  Counter legs_on_new_connection{0};    // legs answered on a freshly connected socket
  Counter legs_on_pooled_connection{0}; // legs answered on a pooled keep-alive connection
  Counter client_write_stalls{0};     // streams aborted: the client stopped reading (timeouts.client_write_ms)
  Counter request_deadlines{0};       // requests ended by timeouts.request_ms
  Counter prefill_deadlines{0};       // prefill legs closed by timeouts.prefill_ms (whole leg)
  OrphanLegCounters orphan_legs;      // orphaned prefill legs (orphan_legs.h)
  Counter prefill_bytes_discarded{0}; // prefill answer bytes read and dropped unbuffered
  Counter held_stream_heads{0};       // decode SSE heads held until the first event (retry still possible)
  std::atomic<int64_t> buffered_bytes{0};   // gauge: request bodies + buffered answers (limits.max_buffered_bytes)
  Counter buffered_answers_over_budget{0};  // decode answers failed: buffering them would exceed the budget
  // Latencies (base/latency_histogram.h): the whole P/D request by outcome [done, failed,
  // cancelled] (arrival = request head parsed, to its end), arrival to the first byte of the
  // answer's body sent to the client, and each leg attempt by [Leg] (sent to its answer complete
  // or its failure, counted in leg_failures).
  std::array<LatencyHistogram, 3> request_duration{};
  LatencyHistogram time_to_first_byte;
  std::array<LatencyHistogram, 2> leg_duration{};
  // The P/D phases per dialect: prefill, handover, decode (pd_phases.h).
  PdPhaseHistograms pd_phases{};
  OneNodeCounters one_node{};  // the one-node endpoints (one_node_relay.h)

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
  // Takes `bytes` from the shared buffered-bytes budget (limits.max_buffered_bytes; 0 = none).
  // False (and nothing taken) if that would go over it. Give them back with
  // buffered_bytes.fetch_sub.
  bool reserve_buffered(size_t bytes, uint64_t budget) {
    const auto n = static_cast<int64_t>(bytes);
    const int64_t before = buffered_bytes.fetch_add(n, std::memory_order_relaxed);
    if (budget != 0 && static_cast<uint64_t>(before + n) > budget) {
      buffered_bytes.fetch_sub(n, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
};

// Every counter above as Prometheus families (pdrouter_request_transitions_total{from,to}, ...),
// the components' sections through their own writers.
void write_proxy_metrics(MetricsWriter& out, const ProxyCounters& counters);

}  // namespace pdr::router::proxy
