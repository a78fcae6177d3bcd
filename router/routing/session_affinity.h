// One request's side of session affinity (topology session_affinity:; the bindings are in
// session_table.h, the spill rule in router/policies/session_spill.h). The session calls:
//   begin()   after parsing: reads the session id (the first configured header the client sent,
//             else the first configured body field present), checks it, and finds the binding
//             of (client binding, id);
//   steer()   before each pairing: names the bound prefill and decode in the PairQuery when
//             each is usable (in the snapshot, up, serving the model, not excluded, not ejected,
//             paired with the other) and not overloaded against its best alternative; a bound
//             node that is not usable or is overloaded is left to the policy. Overloaded: by the
//             spill rule (router/policies/session_spill.h) on the ledgers' figures, except a
//             prefill under predicted_latency, whose spill pairing decides from the predicted
//             TTFTs (PairQuery::preferred_prefill_margin_seconds, spill_margin_queue_ms);
//   routed()  after each pairing: binds the session to the chosen pair when that differs. The
//             turn's first route counts it as a hit, miss, spill or broken binding.
// An id is an exact string (never a prefix): 1..max_id_bytes of printable ASCII without
// spaces; a body field must be a JSON string without escapes. Anything else is counted
// (bad_ids) and the request routes as if it had no session: a client's malformed id costs it
// its stickiness, never its answer.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "discovery/config/topology.h"
#include "discovery/instance.h"
#include "proto/json_splice.h"
#include "router/routing/pairing.h"
#include "router/routing/session_affinity_counters.h"
#include "router/routing/session_table.h"

namespace pdr::router::routing {

// The value of the first of session_affinity.headers present in `header`'s lookup, as
// ProxyService captures it (any thread; `lookup` returns the first header of a name, or nullopt).
template <typename Lookup>
std::optional<std::string_view> first_session_header(const config::Topology::SessionAffinity& config, Lookup&& lookup) {
  for (const std::string& name : config.headers) {
    if (auto value = lookup(name)) return value;
  }
  return std::nullopt;
}

// True when `id` may name a session under `max_bytes`.
bool valid_session_id(std::string_view id, size_t max_bytes);

class SessionAffinityRequest {
 public:
  // nullopt: no session affinity for this request (disabled, no id, or a bad one: counted).
  // `header_value`: the first configured header's value (nullopt: none present). `authorization`
  // and `bind_header_value` are the client's credentials (conversation_binding.h).
  static std::optional<SessionAffinityRequest> begin(const proto::JsonObjectBody& body,
                                                     const config::Topology& topology,
                                                     std::optional<std::string_view> header_value,
                                                     std::string_view authorization,
                                                     std::string_view bind_header_value, SessionTable& table,
                                                     SessionAffinityCounters& counters);

  void steer(const discovery::RegistrySnapshot& snapshot, const config::Topology& topology, PairQuery* query);
  void routed(const Pair& pair, const config::Topology& topology, SessionTable& table,
              SessionAffinityCounters& counters);

  std::string_view id() const { return id_; }
  // The binding found when the request began (tests, traces); nullopt: none.
  const std::optional<SessionTable::Binding>& bound() const { return bound_; }

 private:
  SessionTable::Key key() const { return {binding_, id_}; }

  std::string binding_;
  std::string id_;
  std::optional<SessionTable::Binding> bound_;
  // What the last steer() found, counted by the turn's first routed() (a turn that waited for
  // its SLO is steered again before it is routed).
  enum class Turn : uint8_t { kMiss, kHit, kSpill, kBroken };
  Turn verdict_ = Turn::kMiss;
  bool counted_ = false;  // the first route counts the turn; retries do not
};

}  // namespace pdr::router::routing
