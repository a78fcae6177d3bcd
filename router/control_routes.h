// The operator-facing endpoints: GET /health, GET /status, GET /metrics, and the admin API
// (/admin/..., POST /instances/add; see admin_routes.h). Which request reaches which of them,
// and 404/405, is decided by the route table (route_table.h). With admin.protect_status,
// GET /status needs the admin key (AdminRoutes::admit: same 401/403/429 answers as /admin/*).
//
// The endpoints run on HTTP worker threads concurrently. Each worker reads the registry through its
// own SnapshotReader (indexed by Request::worker), so the steady-state read is one atomic load and
// no lock; everything else it reads is immutable or atomic.
//
// GET /status costs O(registry) to render, so each worker keeps its last rendering and serves it
// again while the registry snapshot version and the topology reload counts are unchanged and it
// is younger than status_max_age (1 s): a new snapshot (instance added, removed, state change)
// shows at once; the fields that change without one (last_seen_ms_ago, expires_in_ms, load,
// connect_failures, ejected_for_ms, uptime_ms, each instance's kv_events counters) are up to
// status_max_age old, and two workers' renderings may differ by that much.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "discovery/discovery_counters.h"
#include "discovery/discovery_service.h"
#include "discovery/instance.h"
#include "proto/base/snapshot_cell.h"
#include "discovery/config/topology_store.h"
#include "router/admin_routes.h"
#include "router/cache/kv_events_subscriber.h"
#include "router/cache/prefix_tree.h"
#include "router/clients/access_log.h"
#include "router/clients/client_gate.h"
#include "router/http/http_server.h"
#include "router/proxy/proxy_counters.h"
#include "discovery/sources/etcd/registry_replicator.h"
#include "discovery/sources/kubernetes/pod_watcher.h"

namespace pdr::router {

class TlsContexts;
namespace routing {
class RouteDecisionLog;
}
namespace tracing {
class Tracer;
}

struct ControlContext {
  const SnapshotCell<discovery::RegistrySnapshot>* registry = nullptr;
  const discovery::DiscoveryCounters* discovery_counters = nullptr;
  const config::TopologyStore* topology = nullptr;  // may be null (tests)
  const http::ServerStats* http_stats = nullptr;       // may be null (tests)
  const proxy::ProxyCounters* proxy_counters = nullptr;  // may be null (tests)
  // For the admin API: registry changes go to the discovery thread, answers come back to the
  // request's worker through the server. Both may be null (tests without an admin API).
  discovery::DiscoveryService* discovery = nullptr;
  http::Server* server = nullptr;
  std::string http_listener;       // "127.0.0.1:10001"
  std::string discovery_listener;  // bound ZMQ endpoint
  std::string discovery_curve_listener;  // bound CURVE endpoint, "" if none
  bool discovery_open = false;     // discovery admits any address from the network (allow_open)
  discovery::Clock::time_point started_at = discovery::Clock::now();
  uint32_t workers = 1;
  // The KV events subscriber (kv_events.enabled), else null: /status kv_events objects, /metrics
  // pdrouter_kv_events_*, GET /debug/cache.
  const cache::KvEventsSubscriber* kv_events = nullptr;
  // The prefix tree of cache-aware routing (router/routing/cache_routing.h), else null: /metrics
  // pdrouter_prefix_tree_*.
  const cache::PrefixTree* prefix_tree = nullptr;
  // The etcd registry replicator (registry.backend: etcd), else null: /status registry_backend,
  // /metrics pdrouter_etcd_*.
  const discovery::sources::etcd::RegistryReplicator* replicator = nullptr;
  // Kubernetes pod discovery (kubernetes.enabled), else null: /status kubernetes, /metrics
  // pdrouter_kubernetes_*.
  const discovery::sources::kubernetes::PodWatcher* pod_watcher = nullptr;
  // Client keys and tenants (router/clients/client_gate.h) and the access log: /metrics
  // pdrouter_client_auth_*, pdrouter_tenant_*, pdrouter_access_log_* (zeros when null).
  const clients::ClientGate* client_gate = nullptr;
  const clients::AccessLog* access_log = nullptr;
  // TLS contexts (router/tls_contexts.h): /metrics pdrouter_listener_tls_*, pdrouter_tls_reloads_*.
  // Null in tests: those families are written as zeros.
  const TlsContexts* tls = nullptr;
  // Tracing (tracing.endpoint set), else null: /metrics pdrouter_trace_* (zeros when off).
  const tracing::Tracer* tracer = nullptr;
  // The predicted_latency policy's decisions (router/routing/route_decisions.h): GET /debug/route,
  // /metrics pdrouter_routing_*. Null in tests: /debug/route is 404, the metrics zeros.
  const routing::RouteDecisionLog* route_decisions = nullptr;
  // GET /status is rendered once per registry snapshot (and topology reload count) and reused
  // for at most this long, so its ages, load and ejection fields are at most this old.
  std::chrono::milliseconds status_max_age{1000};
};

class ControlRoutes {
 public:
  explicit ControlRoutes(ControlContext context);
  const AdminRoutes& admin() const { return admin_; }

  http::Response health(uint32_t worker) const;
  http::Response status(uint32_t worker) const;
  http::Response metrics(uint32_t worker) const;
  // GET /debug/cache (router/debug_cache.h); the route table checks the admin key first.
  http::Response debug_cache(const http::Request& request) const;
  // GET /debug/route (router/routing/route_decisions.h); the route table checks the admin key first.
  http::Response debug_route(const http::Request& request) const;
  // GET /status: status(), behind the admin key when admin.protect_status is set.
  void serve_status(const http::Request& request, http::ResponseWriter writer) const;

  // Worker `worker`'s current registry view (worker < context.workers).
  const discovery::RegistrySnapshot& registry(uint32_t worker) const;

  // Times /status was rendered (not served from its cache); for tests.
  uint64_t status_renders() const { return status_renders_.load(std::memory_order_relaxed); }

 private:
  // A worker's last rendered /status (rendering is O(registry), so a
  // /status loop must not cost that per request).
  struct StatusCache {
    bool valid = false;
    uint64_t registry_version = 0;
    uint64_t reloads = 0;  // reloads_ok + reloads_failed when rendered
    discovery::Clock::time_point rendered_at{};
    std::string body;
  };

  ControlContext context_;
  AdminRoutes admin_;
  // One per worker; a worker only ever touches its own (hence mutable behind const handle()).
  mutable std::vector<SnapshotReader<discovery::RegistrySnapshot>> readers_;
  mutable std::vector<StatusCache> status_cache_;  // one per worker, as readers_
  mutable std::atomic<uint64_t> status_renders_{0};
};

}  // namespace pdr::router
