// RequestRoute: one P/D request's door to routing. The request session (router/proxy/
// proxy_session.h) carries the request; this object chooses where it goes, as Envoy's router
// filter carries a request and asks the load balancer's chooseHost for a host. The session holds
// one (no allocation of its own) and, per attempt, asks it once for a route; everything between
// the parsed request and the pair its legs are built for happens behind it:
//
//   begin()            after parsing: multi-turn (multi_turn.h: takes the conversation's entry;
//                      may refuse, a 400) and session affinity (session_affinity.h).
//   route()            per attempt, asynchronous. The first attempt starts with the affinity
//                      summary, the prompt's token count (router/policies/prompt_tokens.h), the
//                      cache lookup (cache_routing.h) and, for a text prompt, the node /tokenize
//                      call (cache_tokenize.h); then, every attempt: pairing (pairing.h, steered by
//                      multi-turn and session affinity, minus the nodes tried), the SLO check and
//                      wait (slo_gate.h), the pair's load charges, the dialect's endpoint check,
//                      n > 1 and conditional disaggregation (decode_alone.h), then the dialect's
//                      pre-step (pre_step.h). The listener's on_routed gets a Route or a
//                      RouteRefusal, exactly once, unless the route is cancelled first; possibly
//                      inside route().
//   reroute_decode()   the decode retry that keeps the prefill: another decode, not one tried.
//
// and it is told what happened, for what routing learns from it:
//   node_answered() / node_unreachable()   passive health (ejection.h);
//   exclude()          a node failed this request: later attempts avoid it;
//   prefill_failed()   whatever the pre-step cached about the prefill is stale;
//   legs_built()       multi-turn edits the legs, the policy's explanation goes to the
//                      decision log (route_decisions.h);
//   prefill_answered() the prediction's error (route_decisions.h);
//   decode_bytes() / decode_json() / decode_done()   multi-turn learns the conversation's KV;
//   cancel()           the request ended (client gone, deadline): the tokenize call is cancelled
//                      (counted), a pending pre-step answer and an SLO re-check are ignored, the
//                      load a route not handed over yet held is given back.
//
// It answers through a RouteListener (the session), given once at construction, not through
// closures built per attempt: an attempt then costs no std::function and no keep-alive copy.
// Asynchronous steps (the /tokenize call, the SLO wait, the pre-step) ask the listener for a
// keep-alive when they start and hold it until they call back (as UpstreamCallbacks::keep_alive
// does a leg's), never through this object; an attempt answered at once takes none. The Route's
// storage is the listener's (given at construction, as the listener is): RequestRoute builds each
// attempt's route there in place, from its pairing on, and the listener reads it there, so no
// field is moved or copied on the way. The listener lets go of its pair before it asks for
// another route (a retry); until on_routed, a route is RequestRoute's to give back: a refusal
// after pairing or cancel() releases its load at once. Counters: the routing ones it is given
// (RoutingWorker::route_counters); the session's own refusals are the session's to count, from
// RouteRefusal::reason. Worker thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "discovery/config/topology.h"
#include "discovery/instance.h"
#include "discovery/load_charge.h"
#include "proto/base/status.h"
#include "proto/dialects/dialect.h"
#include "proto/json_splice.h"
#include "proto/request_legs.h"
#include "router/http/upstream_client.h"
#include "router/policies/policy.h"
#include "router/policies/prompt_tokens.h"
#include "router/routing/cache_routing.h"
#include "router/routing/decode_alone.h"
#include "router/routing/ejection.h"
#include "router/routing/multi_turn.h"
#include "router/routing/node_calls.h"
#include "router/routing/pairing.h"
#include "router/routing/pre_step.h"
#include "router/routing/routing_shared.h"
#include "router/routing/routing_worker.h"
#include "router/routing/session_affinity.h"
#include "router/routing/session_timer.h"
#include "router/routing/slo_headers.h"

namespace pdr::router::routing {

// What the session knows of the request when it begins. `body`, `model`, `path`,
// `forwarded_authorization` and `affinity_header_value` are viewed for the request's whole life
// (the session's own copies); the rest is read during begin() only.
struct RequestFacts {
  const proto::JsonObjectBody* body = nullptr;  // the client's, parsed
  std::string_view model;                       // its "model" ("" if none)
  std::string_view path;                        // the client's path (the dialect's endpoint check)
  int64_t choices = 1;                          // its n
  std::string_view authorization;               // the client's (binds conversations and sessions)
  std::string_view bind_header_value;           // multi_turn.bind_to header's value
  std::optional<std::string_view> session_header_value;
  std::string_view affinity_header_value;
  // The client's Authorization when it may go on to nodes, else "" (the node /tokenize call's,
  // through upstream_authorization).
  std::string_view forwarded_authorization;
  RequestSlo slo;
};

// A pair to build legs for, with what routing learned on the way. The listener's storage, filled
// in place by RequestRoute (see the top of this file); the listener uses it there.
struct Route {
  Route() = default;
  // `pair` with its DP ranks, a request in flight charged on each node (built in place: no
  // charge is moved).
  Route(Pair&& chosen, std::optional<uint32_t> prefill, std::optional<uint32_t> decode)
      : pair(std::move(chosen)),
        prefill_rank(prefill),
        decode_rank(decode),
        prefill_load(*pair.prefill, prefill_rank),
        decode_load(*pair.decode, decode_rank) {}

  Pair pair;
  std::optional<uint32_t> prefill_rank, decode_rank;
  // A request in flight on each node of the pair (discovery/load_charge.h), from pairing on.
  discovery::LoadCharge prefill_load, decode_load;
  const proto::Dialect* dialect = nullptr;  // of the pair; null: build_legs says why
  std::optional<DecodeAloneReason> decode_alone;  // the decode serves it alone
  PrefillFacts prefill_facts;               // what the dialect's pre-step learned
  // Not OK: the pre-step failed (the session fails the prefill leg with this message).
  Status pre_step = Status::ok();
};

// Why routing refused this attempt.
enum class RouteRefusalReason : uint8_t {
  kNoPair,        // no pair (the message is pairing's); the session words it for a retry
  kNotSupported,  // 501: the pair's dialect has no such endpoint
  kBadParameter,  // 400: n > 1 on a pair whose decode cannot serve alone
  kSloUnmet,      // 503: no candidate predicted within the SLO, shed
  kQueueTimeout,  // 503: waited limits.queue_timeout_ms for one
  kShuttingDown,  // 503: the drain began while it waited
};

struct RouteRefusal {
  RouteRefusalReason reason = RouteRefusalReason::kNoPair;
  int status = 503;
  std::string message;
  std::string code;
};

// Who asks for routes: the request's session. Worker thread only.
class RouteListener {
 public:
  // A pair was chosen (before the checks and the pre-step that may still refuse it or delay the
  // route): the session counts a retry and traces the pair then, as it always did. At most once
  // per attempt (an SLO wait comes before it).
  virtual void on_paired(const Pair& pair) = 0;
  // The attempt's answer: exactly one of the two is set. `route` is the listener's own storage
  // (the one it gave RequestRoute), now holding the attempt's pair and its load: the listener's
  // from here on, RequestRoute touches it again only for the next attempt's pairing. The listener
  // releases that pair (its load charges, its pair) before it asks for the next route, which may
  // happen inside this call (a failure path retries at once). A refusal leaves the storage
  // holding no pair and no load.
  virtual void on_routed(Route* route, RouteRefusal* refusal) = 0;
  // A hold on the request, taken by an asynchronous step while it may still call back.
  virtual std::shared_ptr<void> keep_alive() = 0;

 protected:
  ~RouteListener() = default;
};

class RequestRoute {
 public:
  // `route`: the listener's storage for the attempts' routes (outlives this object, as the
  // listener does).
  RequestRoute(RoutingWorker& worker, RoutingShared& shared, const config::Topology& topology,
               RouteListener& listener, Route& route)
      : w_(worker), shared_(shared), topo_(topology), listener_(listener), route_(route) {}
  RequestRoute(const RequestRoute&) = delete;
  RequestRoute& operator=(const RequestRoute&) = delete;

  // A message: the client's conversation_id is unusable (400, counted by the session as a bad
  // parameter).
  std::optional<std::string> begin(const RequestFacts& facts);

  // One attempt. `retry`: a leg of this request failed before (an SLO wait is for first attempts
  // only). The listener's on_paired runs when a pair is chosen, its on_routed once, after it if
  // a pair was.
  void route(bool retry);
  // A decode for `prefill`, not excluded (DecodeRetry::kDecodeOnly). OK or kNotFound.
  Status reroute_decode(const discovery::Instance& prefill, InstancePtr* out);

  // Passive health (ejection.h). node_unreachable: true when this failure ejected the node.
  void node_answered(const discovery::Instance& node);
  bool node_unreachable(const discovery::Instance& node, http::UpstreamFailure failure, EjectionRule* rule);
  void exclude(proto::Role role, const std::string& key);
  void prefill_failed(const proto::Dialect& dialect, const discovery::Instance& prefill);
  void legs_built(proto::LegBuild& legs, const discovery::Instance& decode, std::string_view request_id) {
    if (explanation_ || multi_turn_) explain_and_edit(legs, decode, request_id);  // else nothing to do
  }
  void prefill_answered(double seconds);
  void decode_bytes(std::string_view chunk) {
    if (multi_turn_) multi_turn_->on_decode_bytes(chunk);
  }
  void decode_json(std::string_view body) {
    if (multi_turn_) multi_turn_->on_decode_json(body);
  }
  void decode_done(const discovery::Instance& decode);
  // The session calls it on every way out (it may twice): a route already cancelled costs a test.
  void cancel() {
    if (!cancelled_) cancel_now();
  }

  // The prompt's token count and the cache lookup's answer (null: no lookup), for the load
  // charges and the access log.
  const PromptTokens& prompt() const { return prompt_; }
  const CacheHits* cache_hits() const { return cache_ ? &cache_->hits : nullptr; }
  // The request takes part in multi-turn KV reuse (legs_built() edited its legs).
  bool multi_turn() const { return multi_turn_.has_value(); }

 private:
  void tokenize_then_pair();
  void pair();
  bool slo_reachable() const;
  void wait_for_slo();
  void refuse(RouteRefusalReason reason, int status, std::string message, std::string code);
  void deliver();
  void drop_route();
  void explain_and_edit(proto::LegBuild& legs, const discovery::Instance& decode, std::string_view request_id);
  void cancel_now();

  RoutingWorker& w_;
  RoutingShared& shared_;
  const config::Topology& topo_;  // pinned by the session for the whole request
  RouteListener& listener_;
  Route& route_;  // the listener's storage: this attempt's route while pending_
  const proto::JsonObjectBody* body_ = nullptr;
  std::string_view model_, path_, forwarded_authorization_, affinity_header_value_;
  int64_t choices_ = 1;
  RequestSlo slo_;
  RouteCounters counters_;   // the worker's (RoutingWorker::route_counters), taken in begin()
  std::string_view prompt_text_;  // the body's prompt (request_prompt), found by the first attempt
  RequestSummary summary_;
  PromptTokens prompt_;
  std::optional<CacheRouting> cache_;
  std::optional<MultiTurnRequest> multi_turn_;
  std::optional<SessionAffinityRequest> session_;
  std::vector<std::string> tried_prefills_, tried_decodes_;
  std::unique_ptr<RouteExplanation> explanation_;  // a load-predicting policy's, else null
  std::optional<double> predicted_ttft_;

  // The attempt in flight.
  bool retry_ = false;
  bool looked_up_ = false;  // the first attempt's lookups ran
  bool cancelled_ = false;
  bool answer_due_ = false;  // route() was called, on_routed not yet (nor cancel())
  uint64_t attempt_ = 0;     // a pre-step answer for an older attempt is ignored
  std::shared_ptr<void> keep_alive_;  // held while the SLO wait runs (its timer reads it)
  // route_ holds this attempt's pair, not handed over yet (its pre-step may be running): a
  // refusal or cancel() gives its load back.
  bool pending_ = false;
  NodeCalls::CallPtr tokenize_call_;
  SessionTimer slo_timer_;  // waiting for a node within the SLO (limits.queue_timeout_ms)
  uint64_t slo_ticket_ = 0;
};

}  // namespace pdr::router::routing
