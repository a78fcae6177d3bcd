// RoutingWorker: what routing needs of the HTTP worker it runs on, as an interface the proxy's
// WorkerContext (router/proxy/proxy_shared.h) implements: the worker's newest registry snapshot
// and topology, its random numbers, its timers, the calls it starts to nodes (NodeCalls: the
// node /tokenize call, the Mooncake bootstrap /query) with the TLS each node wants, its Mooncake
// engine cache, the buffered-bytes budget and the bootstrap query counters. WorkerContext is
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

namespace pdr::router::routing {

class NodeCalls;
class TimerQueue;
class MooncakeEngineCache;
struct BufferBudget;
struct BootstrapQueryCounters;

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

 protected:
  ~RoutingWorker() = default;
};

}  // namespace pdr::router::routing
