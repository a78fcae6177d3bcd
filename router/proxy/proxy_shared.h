// State of the P/D proxy shared by every HTTP worker, and each worker's own context.
//
// ProxyShared: read-mostly pointers and atomics; safe from any worker. The routing policies are
// shared too (their rotation and load state must span workers) and rebuilt when a topology
// reload changes them.
//
// WorkerContext: one per worker, created on first use on that worker's thread and destroyed on it
// (Server's on_worker_stop), because its upstream pool holds handles on the worker's loop. Never
// touched by another thread. P/D requests reach their nodes through upstream() (upstream_port.h):
// the worker's pool, or a fake a test injects.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "discovery/instance.h"
#include "proto/base/log_limiter.h"
#include "proto/base/snapshot_cell.h"
#include "discovery/config/topology.h"
#include "router/http/upstream_client.h"
#include "router/clients/client_gate.h"
#include "router/policies/policy.h"
#include "router/proxy/admission_queue.h"
#include "router/proxy/node_tls.h"
#include "router/proxy/orphan_legs.h"
#include "router/proxy/proxy_counters.h"
#include "router/proxy/upstream_port.h"
#include "router/routing/mooncake_cache.h"
#include "router/routing/routing_shared.h"
#include "router/routing/routing_worker.h"
#include "router/routing/timer_queue.h"

struct uv_loop_s;

namespace pdr::router::clients {
class AccessLog;
}  // namespace pdr::router::clients
namespace pdr::router::tracing {
class Tracer;
}  // namespace pdr::router::tracing

namespace pdr::router::proxy {

// GET /v1/models answer of a decode node, reused for kTtl (model lists change only on restarts).
struct ModelsCache {
  static constexpr std::chrono::seconds kTtl{5};
  std::string body;  // empty: nothing cached
  std::chrono::steady_clock::time_point fetched_at{};
};

struct PolicySet {
  std::unique_ptr<Policy> prefill;
  std::unique_ptr<Policy> decode;
};

// The routing tables (the cache lookup's index and tree, conversations, session bindings, the
// decision log, the SLO gate) are its base, routing::RoutingShared (router/routing/routing_shared.h).
struct ProxyShared : routing::RoutingShared {
  const SnapshotCell<discovery::RegistrySnapshot>* registry = nullptr;
  const SnapshotCell<config::Topology>* topology = nullptr;
  ProxyCounters counters;
  // Requests waiting for one of counters.in_flight's slots (admission_queue.h).
  AdmissionQueue admission_queue{counters.in_flight, counters.admission_queue};
  std::atomic<bool> shutting_down{false};  // set when the drain starts: new requests get 503
  // Where profile fan-outs are counted; null: counters.profile_fanouts. The admin listener's
  // service (listeners.admin) points it at the client service's, so /metrics has one total.
  ProxyCounters::Counter* profile_fanouts = nullptr;
  // HTTP workers serving this proxy (orphan_legs.h shares per-node limits out over them).
  uint32_t workers = 1;
  // Client keys, tenants and their limits (router/clients/client_gate.h).
  clients::ClientGate gate;
  // One line per client request (router/clients/access_log.h); owned by main, set before the
  // first request. Null: no access log.
  clients::AccessLog* access_log = nullptr;
  // TLS to nodes (node_tls.h); null until published (plain HTTP to every node).
  SnapshotCell<NodeTlsContexts> node_tls{nullptr};
  // listeners.tls: how pdrouter reaches its own client listener (GET /health_generate), its
  // certificate pinned (http::TlsClientOptions::pinned); null: plain HTTP.
  SnapshotCell<http::TlsClientContext> self_tls{nullptr};
  // Tracing (router/tracing/tracer.h), owned by main; null: off.
  tracing::Tracer* tracer = nullptr;

  // The policies for `topology`; rebuilt (once, under the mutex) when its policy names differ
  // from the current set's.
  std::shared_ptr<PolicySet> policies_for(const config::Topology& topology);

  // A worker saw registry snapshot `now`: the prefix tree forgets the nodes that left or
  // restarted since the last snapshot handled here, and requests waiting for a node predicted
  // within their SLO (slo_gate) re-check: a node joined, left or changed state. Each snapshot is
  // handled once, by the first worker to see it; an older one than the last handled is ignored,
  // so a worker late to a snapshot cannot forget a node that restarted and has been learnt
  // again since.
  void forget_departed_nodes(const std::shared_ptr<const discovery::RegistrySnapshot>& now);

 private:
  std::mutex departures_mutex_;
  std::shared_ptr<const discovery::RegistrySnapshot> departures_seen_;
  std::mutex policies_mutex_;
  std::shared_ptr<PolicySet> policies_;
  config::PolicyName prefill_name_{}, decode_name_{};
  config::Topology::Policies::CacheAware cache_aware_{};
  config::Topology::Policies::PredictedLatency predicted_latency_{};
};

// What routing needs of its worker (routing::RoutingWorker) is answered here; final, so the
// proxy's own calls are direct.
class WorkerContext final : public routing::RoutingWorker {
 public:
  // `upstream`: where P/D legs and bootstrap queries go; null: this worker's pool. An injected
  // port must outlive the context; close_all() is called on it when the context is destroyed.
  WorkerContext(ProxyShared& shared, uint32_t index, uv_loop_s* loop, UpstreamPort* upstream = nullptr);
  ~WorkerContext();
  WorkerContext(const WorkerContext&) = delete;
  WorkerContext& operator=(const WorkerContext&) = delete;

  ProxyShared& shared() { return shared_; }
  ProxyCounters& counters() { return shared_.counters; }
  uint32_t index() const override { return index_; }
  uv_loop_s* loop() { return loop_; }
  // The deadlines of this worker's sessions and relays (SessionTimer::start).
  routing::TimerQueue& timers() override { return timers_; }
  // This worker's orphaned prefill legs per node (orphan_legs.h).
  OrphanLegs& orphans() { return orphans_; }
  http::UpstreamPool& pool() { return pool_; }
  UpstreamPort& upstream() override { return *upstream_; }
  routing::MooncakeEngineCache& mooncake() override { return mooncake_; }
  routing::BufferBudget& buffered() override { return shared_.counters.buffered; }
  routing::BootstrapQueryCounters& bootstrap_queries() override { return shared_.counters.bootstrap_queries; }
  routing::RouteCounters route_counters() override {
    ProxyCounters& c = shared_.counters;
    return {&c.cache_routing, &c.cache_tokenize, &c.multi_turn, &c.session_affinity};
  }
  routing::RoutePolicies route_policies() override {
    PolicySet& set = policies();
    return {set.prefill.get(), set.decode.get()};
  }
  bool shutting_down() const override { return shared_.shutting_down.load(); }
  // The TLS context of calls to the node at `http_address` (http::UpstreamRequest::tls); null:
  // plain HTTP (node_tls.h).
  const std::shared_ptr<const http::TlsClientContext>& node_tls(const proto::HostPort& http_address) override {
    static const std::shared_ptr<const http::TlsClientContext> kPlain;
    const auto& contexts = node_tls_.get();
    return contexts ? contexts->for_node(http_address) : kPlain;
  }
  // The TLS context of calls to pdrouter's own client listener (ProxyShared::self_tls).
  const std::shared_ptr<const http::TlsClientContext>& self_tls() { return self_tls_.get(); }
  ModelsCache& models() { return models_; }
  // Leg failures are logged through this: a node down under load fails every request.
  LogLimiter& leg_log() { return leg_log_; }

  // Newest snapshot / topology (one atomic load when unchanged). Valid until the next call.
  const std::shared_ptr<const discovery::RegistrySnapshot>& registry() override {
    const auto& now = registry_.get();
    if (now != seen_registry_) on_new_registry(now);
    return now;
  }
  const std::shared_ptr<const config::Topology>& topology() override { return topology_.get(); }
  PolicySet& policies();
  // The tenants of the current topology (clients::TenantRegistry::table_for, asked again only
  // when the topology changed). Valid until the next call.
  const clients::TenantTable& tenants();

  uint64_t random() override;  // splitmix64, seeded per worker from std::random_device

 private:
  ProxyShared& shared_;
  const uint32_t index_;
  uv_loop_s* loop_;
  // Before the pool: sessions ended while the pool closes still take their orphans off it.
  OrphanLegs orphans_;
  routing::TimerQueue timers_;
  http::UpstreamPool pool_;
  PoolUpstreamPort pool_port_{pool_};
  UpstreamPort* upstream_;
  routing::MooncakeEngineCache mooncake_;
  ModelsCache models_;
  LogLimiter leg_log_{"proxy"};
  SnapshotReader<discovery::RegistrySnapshot> registry_;
  // The snapshot this worker last saw: on a new one, nodes that left or restarted since are
  // forgotten by the prefix tree (their caches are gone; ProxyShared::forget_departed_nodes).
  std::shared_ptr<const discovery::RegistrySnapshot> seen_registry_;
  void on_new_registry(const std::shared_ptr<const discovery::RegistrySnapshot>& now);
  SnapshotReader<config::Topology> topology_;
  SnapshotReader<NodeTlsContexts> node_tls_;
  SnapshotReader<http::TlsClientContext> self_tls_;
  std::shared_ptr<const config::Topology> policies_topology_;
  std::shared_ptr<PolicySet> policies_;
  std::shared_ptr<const config::Topology> tenants_topology_;
  std::shared_ptr<const clients::TenantTable> tenants_;
  uint64_t rng_state_;
};

}  // namespace pdr::router::proxy
