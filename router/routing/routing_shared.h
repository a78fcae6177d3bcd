// RoutingShared: routing's state shared by every HTTP worker: the KV block index and the prefix
// tree the cache lookup reads (cache_routing.h), the multi-turn conversations (conversation_cache.h),
// the session affinity bindings (session_table.h), the predicted_latency policy's decision log
// (route_decisions.h) and the SLO gate's waiters (slo_gate.h).
//
// The proxy's ProxyShared (router/proxy/proxy_shared.h) is a RoutingShared: it derives from it,
// so the proxy's code reads these tables under their names as before and hands itself to the
// routing calls that take a RoutingShared. Each member is thread-safe on its own (see its header).
#pragma once

#include "router/routing/conversation_cache.h"
#include "router/routing/route_decisions.h"
#include "router/routing/session_table.h"
#include "router/routing/slo_gate.h"

namespace pdr::router::cache {
class BlockIndex;
class PrefixTree;
}  // namespace pdr::router::cache

namespace pdr::router::routing {

struct RoutingShared {
  // What the cache lookup consults (cache_routing.h); owned by main, set before the first
  // request. Null: kv_events off (block_index) / no text prefix tree.
  const cache::BlockIndex* block_index = nullptr;
  cache::PrefixTree* prefix_tree = nullptr;
  // Multi-turn KV reuse entries (multi_turn.h).
  ConversationCache conversations;
  // Session affinity bindings (session_affinity.h).
  SessionTable sessions;
  // The predicted_latency policy's last decisions (GET /debug/route) and their counters.
  RouteDecisionLog route_decisions;
  // Requests waiting for a candidate predicted within their SLO (slo_gate.h).
  SloGate slo_gate;
};

}  // namespace pdr::router::routing
