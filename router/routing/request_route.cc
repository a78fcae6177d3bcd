#include "router/routing/request_route.h"

#include <chrono>
#include <memory>
#include <utility>

#include "router/routing/cache_tokenize.h"
#include "router/routing/ejection.h"
#include "router/routing/session_affinity_counters.h"

namespace pdr::router::routing {

namespace {

// The affinity inputs of the body, only computed when a policy uses them.
RequestSummary summarize(const proto::JsonObjectBody& body, std::string_view prompt, std::string_view header_value,
                         const config::Topology& topology) {
  using config::PolicyName;
  if (topology.policies.prefill != PolicyName::kAffinity && topology.policies.decode != PolicyName::kAffinity) {
    return {};
  }
  AffinityInputs in;
  in.header_value = header_value;
  // Raw JSON text of the fields: hashing bytes as sent is stable for equal values.
  in.conversation_id = body.get_raw("conversation_id").value_or(std::string_view());
  in.user = body.get_raw("user").value_or(std::string_view());
  in.prompt = prompt;
  if (in.conversation_id == "null") in.conversation_id = {};
  if (in.user == "null") in.user = {};
  return summarize_affinity(in, topology.policies.affinity_prefix_bytes);
}

void bump(std::atomic<uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

// `chosen`'s route built in *r in place, as std::optional::emplace builds its value: no load
// charge is moved. What *r held goes first (the listener let go of its pair already).
Route& build_route(Route* r, Pair&& chosen, std::optional<uint32_t> prefill_rank,
                   std::optional<uint32_t> decode_rank) {
  std::destroy_at(r);
  try {
    return *std::construct_at(r, std::move(chosen), prefill_rank, decode_rank);
  } catch (...) {
    std::construct_at(r);  // the listener's member is never left destroyed
    throw;
  }
}

}  // namespace

std::optional<std::string> RequestRoute::begin(const RequestFacts& facts) {
  body_ = facts.body;
  model_ = facts.model;
  path_ = facts.path;
  choices_ = facts.choices;
  slo_ = facts.slo;
  forwarded_authorization_ = facts.forwarded_authorization;
  affinity_header_value_ = facts.affinity_header_value;
  counters_ = w_.route_counters();
  if (auto refusal = MultiTurnRequest::begin(*body_, topo_, choices_ == 1, facts.authorization,
                                             facts.bind_header_value, shared_.conversations, *counters_.multi_turn,
                                             &multi_turn_)) {
    return refusal;
  }
  session_ = SessionAffinityRequest::begin(*body_, topo_, facts.session_header_value, facts.authorization,
                                           facts.bind_header_value, shared_.sessions, *counters_.session_affinity);
  return std::nullopt;
}

void RequestRoute::route(bool retry) {
  retry_ = retry;
  answer_due_ = true;
  ++attempt_;
  if (!looked_up_) {
    looked_up_ = true;
    prompt_text_ = request_prompt(*body_);  // found once: decode_alone_reason reads it per attempt
    summary_ = summarize(*body_, prompt_text_, affinity_header_value_, topo_);
    prompt_ = count_prompt_tokens(prompt_text_);
    summary_.prompt = &prompt_;
    cache_ = lookup_cache(*body_, model_, topo_, shared_);
    if (cache_) summary_.cache = &cache_->hits;
    if (cache_ && cache_->hits.source == CacheHits::Source::kPrefixTree && wants_tokenize(*body_, topo_, shared_)) {
      tokenize_then_pair();
      return;
    }
  }
  pair();
}

void RequestRoute::tokenize_then_pair() {
  CacheTokenizeCounters* counters = counters_.cache_tokenize;
  auto count = [counters](TokenizeResult r) { bump((*counters)[static_cast<size_t>(r)]); };
  // The call's callbacks keep the request alive, as a leg's do; cancel() releases them. The hold
  // moves to the stack when the answer comes: the route that follows may release the call.
  tokenize_call_ = start_tokenize(
      w_, *body_, model_, forwarded_authorization_,
      [this, hold = listener_.keep_alive(), count](bool ok, TokenizeResult why_not,
                                                   std::vector<uint32_t>&& tokens) mutable {
        const std::shared_ptr<void> held = std::move(hold);
        if (cancelled_) return;
        tokenize_call_.reset();
        if (ok && !tokens.empty()) {  // the node's count of the prompt's tokens is exact
          prompt_.count = tokens.size();
          prompt_.source = PromptTokens::Source::kTokenized;
        }
        if (!ok) {
          count(why_not);
        } else if (match_token_ids(tokens, model_, shared_, &*cache_)) {
          count(TokenizeResult::kMatched);
        } else {
          count(TokenizeResult::kNoMatch);
        }
        pair();
      });
  if (!tokenize_call_) {
    count(TokenizeResult::kNoNode);
    pair();
  }
}

void RequestRoute::pair() {
  const RouteCounters& counters = counters_;
  const auto& snapshot = w_.registry();
  const RoutePolicies policies = w_.route_policies();
  PairQuery query{model_, tried_prefills_, tried_decodes_, summary_, discovery::Clock::now()};
  if (multi_turn_) query.preferred_decode = multi_turn_->preferred_decode();
  if (session_) session_->steer(*snapshot, topo_, &query);
  if (policies.prefill->needs_load() || policies.decode->needs_load()) {
    if (!explanation_) explanation_ = std::make_unique<RouteExplanation>();
    *explanation_ = RouteExplanation{};
    query.summary.explain = explanation_.get();
  }
  Pair pair;
  Status st = choose_pair(*snapshot, query, *policies.prefill, *policies.decode, &pair);
  if (!st.is_ok()) {
    refuse(RouteRefusalReason::kNoPair, 503, st.message(), "no_pair");
    return;
  }
  if (explanation_ && choices_ <= 1 && topo_.conditional_disaggregation.prefill_busy_ms != 0) {
    // The prefills may be too busy: then the decode computes the prompt itself. Decided here,
    // before the SLO check, so that the check reads the prediction of what will run.
    explanation_->decode_alone_seconds = decode_alone_when_busy(
        topo_.conditional_disaggregation, topo_.policies.predicted_latency,
        proto::dialect_for(pair.prefill->connector, pair.prefill->transfer_mode), *explanation_,
        uncached_tokens(prompt_, cache_hits(), pair.decode->key));
  }
  if (!retry_ && slo_.any() && explanation_ && !slo_reachable()) {
    wait_for_slo();
    return;
  }
  if (slo_timer_.armed()) slo_timer_.stop();
  if (cache_) record_routing(*cache_, pair, shared_, *counters.cache_routing);
  if (session_) session_->routed(pair, topo_, shared_.sessions, *counters.session_affinity);
  listener_.on_paired(pair);
  const std::optional<uint32_t> prefill_rank = next_dp_rank(*pair.prefill);
  const std::optional<uint32_t> decode_rank = next_dp_rank(*pair.decode);
  Route& r = build_route(&route_, std::move(pair), prefill_rank, decode_rank);
  pending_ = true;

  r.dialect = proto::dialect_for(r.pair.prefill->connector, r.pair.prefill->transfer_mode);
  if (const std::string_view why = r.dialect != nullptr ? proto::unsupported_endpoint(*r.dialect, path_) : "";
      !why.empty()) {
    // Not a fault of the client's body nor of the nodes: this connector has no such endpoint.
    refuse(RouteRefusalReason::kNotSupported, 501,
           std::string(path_) + " is not supported with the " + std::string(r.dialect->name) +
               " connector dialect: " + std::string(why),
           "not_supported");
    return;
  }
  if (choices_ > 1) {
    if (r.dialect == nullptr || r.dialect->without_kv == nullptr) {
      std::string able;  // the dialects whose decode can: those with a no-KV fallback
      for (const proto::Dialect* d : proto::all_dialects()) {
        if (d->without_kv != nullptr) able += (able.empty() ? "" : ", ") + std::string(d->name);
      }
      refuse(RouteRefusalReason::kBadParameter, 400,
             "n = " + std::to_string(choices_) + " is not supported here: parallel sampling cannot go through "
             "prefill/decode (KV moves per request, not per choice), and the decode of this pair (" +
                 std::string(r.dialect != nullptr ? r.dialect->name : "unknown") + ") cannot compute a prompt alone (" +
                 able + " decodes can); send n = 1",
             "invalid_parameter");
      return;
    }
    r.decode_alone = DecodeAloneReason::kParallelSampling;
  } else {
    r.decode_alone = decode_alone_reason(topo_.conditional_disaggregation, r.dialect, prompt_text_, cache_hits(),
                                         r.pair.decode->key);
    if (explanation_ && explanation_->decode_alone_seconds) {
      if (!r.decode_alone) r.decode_alone = DecodeAloneReason::kPrefillBusy;
      else explanation_->decode_alone_seconds.reset();  // another reason sends it alone
    }
  }
  if (r.dialect == nullptr || r.dialect->pre_step == proto::PreStep::kNone || r.decode_alone) {
    deliver();  // (no dialect: build_legs says why)
    return;
  }
  // The dialect's pre-step (Mooncake: the prefill's engine id for the chosen DP rank). Its answer
  // keeps the request alive until the route is handed over, as the tokenize call's does.
  run_pre_step(*r.dialect, w_, topo_, r.pair.prefill, r.prefill_rank,
               [this, hold = listener_.keep_alive(), attempt = attempt_](const Status& status,
                                                                       const PrefillFacts& facts) mutable {
                 const std::shared_ptr<void> held = std::move(hold);
                 if (cancelled_ || attempt != attempt_ || !pending_) return;
                 if (!status.is_ok()) {
                   route_.pre_step = status;
                 } else {
                   route_.prefill_facts = facts;
                   route_.prefill_rank = facts.prefill_rank;
                   route_.prefill_load.move_to_rank(facts.prefill_rank);
                 }
                 deliver();
               });
}

bool RequestRoute::slo_reachable() const {
  const LegExplanation& p = explanation_->prefill;
  const LegExplanation& d = explanation_->decode;
  if (slo_.ttft_ms != 0 && explanation_->decode_alone_seconds) {
    if (*explanation_->decode_alone_seconds * 1000 > slo_.ttft_ms) return false;
  } else if (slo_.ttft_ms != 0 && p.filled && p.chosen < p.rows.size() &&
             p.rows[p.chosen].predicted_seconds * 1000 > slo_.ttft_ms) {
    return false;
  }
  // A prompt whose KV alone overflows a decode (kv_capacity_tokens) is predicted past any TPOT
  // on every node, idle or not: waiting cannot help, so the check does not hold it and the node
  // answers (vLLM refuses a prompt over its context with 400, which a 503 here would turn into
  // retries).
  const bool never_fits = prompt_.count > topo_.policies.predicted_latency.kv_capacity_tokens;
  if (slo_.tpot_ms != 0 && !never_fits && d.filled && d.chosen < d.rows.size() &&
      d.rows[d.chosen].predicted_seconds * 1000 > slo_.tpot_ms) {
    return false;
  }
  return true;
}

void RequestRoute::wait_for_slo() {
  const auto& limits = topo_.limits;
  if (topo_.policies.predicted_latency.shed || !limits.queue_enabled()) {
    refuse(RouteRefusalReason::kSloUnmet, 503,
           "no node is predicted to serve this request within its SLO (x-slo-ttft-ms / x-slo-tpot-ms)", "slo_unmet");
    return;
  }
  // From here the request waits: the timer's callback and the gate's hold it (a re-check that
  // waits again keeps the hold it has).
  if (!keep_alive_) keep_alive_ = listener_.keep_alive();
  if (!slo_timer_.armed()) {
    slo_timer_.start(w_.timers(), limits.queue_timeout, [this] {
      // The gate's closure keeps the request alive until here; withdrawing it drops that hold,
      // so this one keeps it until the callback returns.
      std::shared_ptr<void> hold = keep_alive_;
      shared_.slo_gate.withdraw(slo_ticket_);
      if (cancelled_) {  // its client went away while it waited
        keep_alive_.reset();
        return;
      }
      refuse(RouteRefusalReason::kQueueTimeout, 503,
             "no node was predicted to serve this request within its SLO within limits.queue_timeout_ms = " +
                 std::to_string(topo_.limits.queue_timeout.count()) + " ms",
             "queue_timeout");
    });
  }
  // Woken when a leg ends anywhere or the registry changes (slo_gate.h): the pairing runs again.
  // The gate holds the request (nothing else does while no leg runs) until then or the deadline.
  // The drain wakes the gate too: a waiter is then answered 503 shutting_down at once, as the
  // admission queue's are, instead of holding the drain up until its deadline.
  slo_ticket_ = shared_.slo_gate.park(w_.index(), [this, hold = keep_alive_] {
    if (cancelled_) {  // its client went away while it waited: nothing holds it any longer
      slo_timer_.stop();
      keep_alive_.reset();
      return;
    }
    if (w_.shutting_down()) {
      refuse(RouteRefusalReason::kShuttingDown, 503, "pdrouter is shutting down", "shutting_down");
      return;
    }
    pair();
  });
  // A drain that began before the park woke nobody: wake now (the flag is stored before the
  // drain's wake, and read here after the park, so one of the two wakes sees this waiter).
  if (w_.shutting_down()) shared_.slo_gate.wake();
}

void RequestRoute::refuse(RouteRefusalReason reason, int status, std::string message, std::string code) {
  RouteRefusal refusal{reason, status, std::move(message), std::move(code)};
  if (pending_) drop_route();  // refused after pairing: the pair's load goes back at once
  const std::shared_ptr<void> hold = std::move(keep_alive_);
  if (!answer_due_) return;
  answer_due_ = false;
  listener_.on_routed(nullptr, &refusal);
}

void RequestRoute::deliver() {
  const std::shared_ptr<void> hold = std::move(keep_alive_);
  if (!answer_due_) {  // nobody to hand it to
    drop_route();
    return;
  }
  answer_due_ = false;
  // Already in the listener's storage: from here on the listener's (a retry inside on_routed
  // pairs into it again, as its own pending route).
  pending_ = false;
  listener_.on_routed(&route_, nullptr);
}

void RequestRoute::drop_route() {
  pending_ = false;
  const bool held = route_.prefill_load.bound() || route_.decode_load.bound();
  route_ = Route();
  if (held) shared_.slo_gate.wake();
}

Status RequestRoute::reroute_decode(const discovery::Instance& prefill, InstancePtr* out) {
  const auto& snapshot = w_.registry();
  PairQuery query{model_, tried_prefills_, tried_decodes_, summary_, discovery::Clock::now()};
  return choose_decode(*snapshot, prefill, query, *w_.route_policies().decode, out);
}

void RequestRoute::node_answered(const discovery::Instance& node) { note_answer(*node.liveness); }

bool RequestRoute::node_unreachable(const discovery::Instance& node, http::UpstreamFailure failure,
                                    EjectionRule* rule) {
  if (failure != http::UpstreamFailure::kConnect && failure != http::UpstreamFailure::kConnectTimeout) return false;
  *rule = EjectionRule{topo_.retries.eject_after_connect_failures, topo_.retries.eject};
  return note_connect_failure(*node.liveness, discovery::Clock::now(), *rule);
}

void RequestRoute::exclude(proto::Role role, const std::string& key) {
  (role == proto::Role::kPrefill ? tried_prefills_ : tried_decodes_).push_back(key);
}

void RequestRoute::prefill_failed(const proto::Dialect& dialect, const discovery::Instance& prefill) {
  forget_pre_step(dialect, w_, prefill);
}

void RequestRoute::explain_and_edit(proto::LegBuild& legs, const discovery::Instance& decode,
                                    std::string_view request_id) {
  if (explanation_) {
    // Keeps the policy's explanation of this attempt's pair in GET /debug/route's ring.
    const LegExplanation& prefill = explanation_->prefill;
    predicted_ttft_.reset();
    if (prefill.filled && prefill.chosen < prefill.rows.size() && !explanation_->decode_alone_seconds) {
      predicted_ttft_ = prefill.rows[prefill.chosen].predicted_seconds;
    }
    RouteDecision d;
    d.request_id = std::string(request_id);
    d.unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
    d.explanation = std::move(*explanation_);
    shared_.route_decisions.record(std::move(d));
  }
  if (multi_turn_) multi_turn_->on_legs_built(legs, decode, *counters_.multi_turn);
}

void RequestRoute::prefill_answered(double seconds) {
  if (predicted_ttft_) shared_.route_decisions.observe_ttft(*predicted_ttft_, seconds);
  predicted_ttft_.reset();
}

void RequestRoute::decode_done(const discovery::Instance& decode) {
  if (multi_turn_) multi_turn_->on_done(decode, topo_, shared_.conversations, *counters_.multi_turn);
}

void RequestRoute::cancel_now() {
  cancelled_ = true;
  if (tokenize_call_) {  // the request ended before its cache lookup did
    tokenize_call_->cancel();
    tokenize_call_.reset();
    bump((*counters_.cache_tokenize)[static_cast<size_t>(TokenizeResult::kCancelled)]);
  }
  // Paired, its pre-step running: the pair's load goes back. A route handed over already (cancel()
  // from inside on_routed too) is the listener's to release.
  if (pending_) drop_route();
  answer_due_ = false;
  // Waiting in the SLO gate: the gate's closure holds the request until its re-check or the
  // deadline runs, which then lets go of this hold too (as before the request ends).
  if (!slo_timer_.armed()) keep_alive_.reset();
}

}  // namespace pdr::router::routing
