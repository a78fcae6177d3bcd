#include "router/routing/session_affinity.h"

#include <algorithm>
#include <vector>

#include "proto/dialects/dialect.h"
#include "router/policies/session_spill.h"
#include "router/routing/conversation_binding.h"
#include "router/routing/ejection.h"

namespace pdr::router::routing {

using discovery::Instance;

bool valid_session_id(std::string_view id, size_t max_bytes) {
  if (id.empty() || id.size() > max_bytes) return false;
  return std::all_of(id.begin(), id.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

namespace {

SessionTable::Limits limits_of(const config::Topology::SessionAffinity& c) {
  return SessionTable::Limits{c.max_sessions, c.idle_ttl};
}

// The id a body field gives: a JSON string without escapes (its text between the quotes);
// nullopt when the field is absent or null; "" (refused by the caller) when it is another value.
std::optional<std::string_view> field_id(const proto::JsonObjectBody& body, std::string_view field) {
  const std::optional<std::string_view> raw = body.get_raw(field);
  if (!raw || *raw == "null") return std::nullopt;
  if (raw->size() < 2 || raw->front() != '"' || raw->back() != '"') return std::string_view();
  const std::string_view text = raw->substr(1, raw->size() - 2);
  // An escaped spelling of an id would be a second name for it.
  if (text.find('\\') != std::string_view::npos) return std::string_view();
  return text;
}

SessionNodeLoad load_of(const Instance& node, discovery::Clock::time_point now) {
  SessionNodeLoad load;
  load.requests = node.liveness->outstanding.load(std::memory_order_relaxed);
  load.weight = std::max<uint32_t>(1, node.dp_size);
  if (node.role == proto::Role::kPrefill) {
    const auto rate = node.liveness->ledger.prefill_tokens_per_second.read(now);
    if (rate.present() && rate.value > 0) {
      load.queue_seconds =
          static_cast<double>(node.liveness->ledger.totals().queued_prefill_tokens) / rate.value;
    }
  }
  return load;
}

bool excluded(std::span<const std::string> keys, std::string_view key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

enum class Verdict : uint8_t { kStay, kBroken, kSpill };

// Whether the session may stay on `node` (its bound node of `role`).
// `predicted`: the policy of `role` predicts latencies; pairing then judges the load by them
// (PairQuery::preferred_prefill_margin_seconds) and only usability is judged here.
Verdict judge(const discovery::RegistrySnapshot& snapshot, const Instance* node, proto::Role role,
              const PairQuery& q, std::span<const std::string> excluded_keys, const SpillMargins& margins,
              bool predicted) {
  if (node == nullptr || node->role != role || !routable(*node) || node->connector == proto::Connector::kUnknown ||
      !serves_model(*node, q.model) || excluded(excluded_keys, node->key) ||
      (q.now != discovery::Clock::time_point{} && ejected(*node->liveness, q.now))) {
    return Verdict::kBroken;
  }
  if (predicted) return Verdict::kStay;
  // The alternatives: the usable members of the node's pairing class.
  // A hand-made snapshot (tests) has no index: build one, as pairing does.
  discovery::RoutableIndex local;
  if (!snapshot.routable.built) local = discovery::RoutableIndex::build(snapshot.instances);
  const discovery::RoutableIndex& index = snapshot.routable.built ? snapshot.routable : local;
  const discovery::RoutableGroup* group =
      index.find(role, node->connector, proto::pairing_mode(node->connector, node->transfer_mode));
  if (group == nullptr) return Verdict::kStay;
  thread_local std::vector<const std::shared_ptr<const Instance>*> members;
  thread_local std::vector<SessionNodeLoad> alternatives;
  members.clear();
  alternatives.clear();
  group->serving(q.model, &members);
  const auto steady_now = std::chrono::steady_clock::now();
  for (const auto* m : members) {
    const Instance& other = **m;
    if (other.key == node->key || excluded(excluded_keys, other.key)) continue;
    if (q.now != discovery::Clock::time_point{} && ejected(*other.liveness, q.now)) continue;
    alternatives.push_back(load_of(other, steady_now));
  }
  return sticky_overloaded(load_of(*node, steady_now), alternatives, margins) ? Verdict::kSpill : Verdict::kStay;
}

}  // namespace

std::optional<SessionAffinityRequest> SessionAffinityRequest::begin(
    const proto::JsonObjectBody& body, const config::Topology& topology, std::optional<std::string_view> header_value,
    std::string_view authorization, std::string_view bind_header_value, SessionTable& table,
    SessionAffinityCounters& counters) {
  const auto& config = topology.session_affinity;
  if (!config.enabled) return std::nullopt;
  std::optional<std::string_view> id = header_value;
  for (size_t f = 0; !id && f < config.fields.size(); ++f) id = field_id(body, config.fields[f]);
  if (!id) return std::nullopt;
  if (!valid_session_id(*id, config.max_id_bytes)) {
    counters.bad_ids.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  std::optional<std::string> binding = conversation_binding(topology.multi_turn, authorization, bind_header_value);
  if (!binding) return std::nullopt;
  SessionAffinityRequest r;
  r.binding_ = std::move(*binding);
  r.id_.assign(*id);
  r.bound_ = table.find(r.key(), SessionTable::Clock::now(), limits_of(config));
  return r;
}

void SessionAffinityRequest::steer(const discovery::RegistrySnapshot& snapshot, const config::Topology& topology,
                                   PairQuery* q) {
  if (!bound_) {
    verdict_ = Turn::kMiss;
    return;
  }
  const auto& config = topology.session_affinity;
  const double margin_seconds = std::chrono::duration<double>(config.spill_margin_queue).count();
  const SpillMargins margins{config.spill_margin_requests, margin_seconds};
  // predicted_latency predicts the bound prefill's TTFT with the prompt it holds: the spill then
  // compares that prediction with the best candidate's (pairing.h), which the queue figures of the
  // rule below cannot (they do not know what the session's KV saves).
  const bool predicted = topology.policies.prefill == config::PolicyName::kPredictedLatency;
  const Instance* prefill = snapshot.find(bound_->prefill_key);
  const Instance* decode = snapshot.find(bound_->decode_key);
  Verdict p = judge(snapshot, prefill, proto::Role::kPrefill, *q, q->excluded_prefills, margins, predicted);
  Verdict d = judge(snapshot, decode, proto::Role::kDecode, *q, q->excluded_decodes, margins, false);
  if (p == Verdict::kStay && d == Verdict::kStay && !compatible(*prefill, *decode)) d = Verdict::kBroken;
  if (p == Verdict::kStay) {
    q->preferred_prefill = prefill->key;
    if (predicted) q->preferred_prefill_margin_seconds = margin_seconds;
  }
  // A conversation's decode (multi_turn.h) holds KV the next turn reuses: it wins over the
  // session's.
  if (d == Verdict::kStay && q->preferred_decode.empty()) q->preferred_decode = decode->key;
  if (p == Verdict::kSpill || d == Verdict::kSpill) {
    verdict_ = Turn::kSpill;
  } else if (p == Verdict::kBroken || d == Verdict::kBroken) {
    verdict_ = Turn::kBroken;
  } else {
    verdict_ = Turn::kHit;
  }
}

void SessionAffinityRequest::routed(const Pair& pair, const config::Topology& topology, SessionTable& table,
                                    SessionAffinityCounters& counters) {
  if (!counted_) {  // the turn's first route counts it; retries do not
    counted_ = true;
    Turn turn = verdict_;
    if (turn == Turn::kHit && pair.prefill_spilled) turn = Turn::kSpill;
    switch (turn) {
      case Turn::kMiss: counters.misses.fetch_add(1, std::memory_order_relaxed); break;
      case Turn::kHit: counters.hits.fetch_add(1, std::memory_order_relaxed); break;
      case Turn::kSpill: counters.spills.fetch_add(1, std::memory_order_relaxed); break;
      case Turn::kBroken: counters.broken.fetch_add(1, std::memory_order_relaxed); break;
    }
  }
  if (bound_ && bound_->prefill_key == pair.prefill->key && bound_->decode_key == pair.decode->key) {
    table.refresh(key(), SessionTable::Clock::now(), limits_of(topology.session_affinity));
    return;
  }
  if (bound_) counters.rebinds.fetch_add(1, std::memory_order_relaxed);
  table.bind(key(), pair.prefill->key, pair.decode->key, SessionTable::Clock::now(),
             limits_of(topology.session_affinity));
  bound_ = SessionTable::Binding{pair.prefill->key, pair.decode->key};
}

}  // namespace pdr::router::routing
