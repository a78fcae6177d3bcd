// RoutingWorker: what routing needs of the HTTP worker it runs on, as an interface the proxy's
// WorkerContext (router/proxy/proxy_shared.h) implements: the worker's newest registry snapshot
// and topology, its random numbers, its timers, the calls it starts to nodes (NodeCalls: the
// node /tokenize call, the Mooncake bootstrap /query) with the TLS each node wants, its Mooncake
// engine cache, the buffered-bytes budget, the routing policies of the current topology, whether
// the drain began, and the routing counters (request_route.h). WorkerContext is
// final, so the proxy's own calls on it stay direct; routing's go through this table.
//
// Worker thread only, as WorkerContext.
#pragma once

#include <cstdint>
#include <memory>

#include "discovery/config/topology.h"
#include "discovery/instance.h"
#include "proto/address.h"
#include "router/http/upstream_client.h"
#include "router/policies/policy.h"
#include "router/routing/cache_routing_counters.h"

namespace pdr::router::routing {

class NodeCalls;
class TimerQueue;
class MooncakeEngineCache;
struct BufferBudget;
struct BootstrapQueryCounters;
struct MultiTurnCounters;
struct SessionAffinityCounters;

// The counters a request's routing bumps (members of the proxy's ProxyCounters).
struct RouteCounters {
  CacheRoutingCounters* cache_routing = nullptr;
  CacheTokenizeCounters* cache_tokenize = nullptr;
  MultiTurnCounters* multi_turn = nullptr;
  SessionAffinityCounters* session_affinity = nullptr;
};

// The policies of the worker's current topology; valid until the worker's next call.
struct RoutePolicies {
  Policy* prefill = nullptr;
  Policy* decode = nullptr;
};

class RoutingWorker {
 public:
  // Newest snapshot / topology. Valid until the next call.
  virtual const std::shared_ptr<const discovery::RegistrySnapshot>& registry() = 0;
  virtual const std::shared_ptr<const config::Topology>& topology() = 0;
  virtual uint64_t random() = 0;
  // The deadlines of this worker (SessionTimer::start).
  virtual TimerQueue& timers() = 0;
  // Where calls to nodes start.
  virtual NodeCalls& upstream() = 0;
  // The TLS context of calls to the node at `http_address`; null: plain HTTP.
  virtual const std::shared_ptr<const http::TlsClientContext>& node_tls(const proto::HostPort& http_address) = 0;
  virtual MooncakeEngineCache& mooncake() = 0;
  // limits.max_buffered_bytes, shared by every worker (buffer_budget.h).
  virtual BufferBudget& buffered() = 0;
  virtual BootstrapQueryCounters& bootstrap_queries() = 0;
  virtual RouteCounters route_counters() = 0;
  virtual RoutePolicies route_policies() = 0;
  // This worker's index (where an SLO re-check is posted, slo_gate.h).
  virtual uint32_t index() const = 0;
  // The drain began: new requests get 503.
  virtual bool shutting_down() const = 0;

 protected:
  ~RoutingWorker() = default;
};

}  // namespace pdr::router::routing
