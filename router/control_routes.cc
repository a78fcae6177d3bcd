#include "router/control_routes.h"

#include <algorithm>

#include "router/admin_metrics.h"
#include "router/debug_cache.h"
#include "router/kv_events_metrics.h"
#include "router/etcd_metrics.h"
#include "router/upstream_tls_metrics.h"
#include "router/kubernetes_metrics.h"
#include "router/node_load_metrics.h"
#include "router/node_engine_load_metrics.h"
#include "router/metrics_page.h"
#include "router/routing/session_table.h"
#include "router/status_page.h"
#include "router/proxy/engine_metrics.h"
#include "router/proxy/health_generate.h"
#include "router/routing/route_decisions.h"
#include "router/tls_contexts.h"
#include "router/tracing/tracer.h"

namespace pdr::router {

ControlRoutes::ControlRoutes(ControlContext context)
    : context_(std::move(context)),
      admin_(AdminContext{context_.topology, context_.discovery, context_.server, context_.workers}) {
  readers_.reserve(std::max(1u, context_.workers));
  for (uint32_t i = 0; i < std::max(1u, context_.workers); ++i) readers_.emplace_back(*context_.registry);
  status_cache_.resize(readers_.size());
}

const discovery::RegistrySnapshot& ControlRoutes::registry(uint32_t worker) const {
  return *readers_.at(worker).get();
}

void ControlRoutes::serve_status(const http::Request& request, http::ResponseWriter writer) const {
  if (context_.topology != nullptr && context_.topology->current()->admin.protect_status &&
      !admin_.admit(request, writer)) {
    return;
  }
  writer.send(status(request.worker));
}

http::Response ControlRoutes::health(uint32_t) const { return http::Response::json(200, R"({"status":"ok"})"); }

http::Response ControlRoutes::status(uint32_t worker) const {
  const auto now = discovery::Clock::now();
  const discovery::RegistrySnapshot& snapshot = registry(worker);
  const uint64_t reloads = context_.topology != nullptr
                               ? context_.topology->reloads_ok() + context_.topology->reloads_failed()
                               : 0;
  StatusCache& cache = status_cache_.at(worker);
  if (cache.valid && cache.registry_version == snapshot.version && cache.reloads == reloads &&
      now - cache.rendered_at < context_.status_max_age) {
    return http::Response::json(200, cache.body);
  }
  StatusContext sc;
  sc.http_listener = context_.http_listener;
  sc.discovery_listener = context_.discovery_listener;
  sc.discovery_curve_listener = context_.discovery_curve_listener;
  sc.discovery_open = context_.discovery_open;
  sc.uptime_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - context_.started_at).count();
  sc.workers = context_.workers;
  if (context_.topology != nullptr) {
    sc.topology_path = context_.topology->path();
    sc.topology_reloads_ok = context_.topology->reloads_ok();
    sc.topology_reloads_failed = context_.topology->reloads_failed();
    sc.topology_last_error = context_.topology->last_error();
    sc.class_caps = context_.topology->current()->discovery.max_instances_per_class;
  }
  {
    const config::Topology::Limits limits =
        context_.topology != nullptr ? context_.topology->current()->limits : config::Topology::Limits{};
    StatusContext::AdmissionQueue& q = sc.admission_queue;
    q.enabled = limits.queue_enabled();
    q.max_concurrent_requests = limits.max_concurrent_requests;
    q.max_queued_requests = limits.max_queued_requests;
    q.max_queued_bytes = limits.max_queued_bytes;
    q.queue_timeout_ms = limits.queue_timeout.count();
    if (context_.proxy_counters != nullptr) {
      const proxy::ProxyCounters& c = *context_.proxy_counters;
      StatusContext::SessionAffinity& sa = sc.session_affinity;
      sa.enabled = context_.topology != nullptr && context_.topology->current()->session_affinity.enabled;
      sa.sessions = c.sessions != nullptr ? c.sessions->stats().entries : 0;
      const auto& sac = c.session_affinity;
      sa.hits = sac.hits.load(std::memory_order_relaxed);
      sa.misses = sac.misses.load(std::memory_order_relaxed);
      sa.spills = sac.spills.load(std::memory_order_relaxed);
      sa.broken = sac.broken.load(std::memory_order_relaxed);
      sa.rebinds = sac.rebinds.load(std::memory_order_relaxed);
      sa.bad_ids = sac.bad_ids.load(std::memory_order_relaxed);
      q.in_flight = c.in_flight.load(std::memory_order_relaxed);
      q.bytes = c.admission_queue.bytes.load(std::memory_order_relaxed);
      for (uint32_t p = 0; p < proxy::kPriorityClasses; ++p) {
        q.by_priority[p] = c.admission_queue.depth[p].load(std::memory_order_relaxed);
      }
    }
  }
  std::vector<cache::KvEventsNodeStats> kv_events;
  if (context_.kv_events != nullptr) {
    kv_events = context_.kv_events->node_stats();
    sc.kv_events = &kv_events;
  }
  if (context_.replicator != nullptr) {
    const discovery::sources::etcd::ReplicatorStatus& rs = context_.replicator->status();
    sc.registry_backend.backend = "etcd";
    sc.registry_backend.etcd_reachable = rs.reachable.load(std::memory_order_relaxed);
    sc.registry_backend.replica_id = context_.replicator->options().replica_id;
    sc.registry_backend.replica_entries = rs.replica_entries.load(std::memory_order_relaxed);
    sc.registry_backend.last_error = context_.replicator->last_error();
    sc.registry_backend.bad_entries = rs.bad_entries.load(std::memory_order_relaxed);
    sc.registry_backend.last_bad_entry = context_.replicator->last_bad_entry();
    if (context_.proxy_counters != nullptr && context_.proxy_counters->conversations != nullptr) {
      const auto cs = context_.proxy_counters->conversations->stats();
      sc.registry_backend.conversation_entries_local = cs.entries - cs.remote_entries;
      sc.registry_backend.conversation_entries_mirrored = cs.remote_entries;
    }
  }
  if (context_.pod_watcher != nullptr) {
    const discovery::sources::kubernetes::PodWatcher& w = *context_.pod_watcher;
    sc.kubernetes.enabled = true;
    sc.kubernetes.api_server = w.options().kubernetes.api_server_url;
    sc.kubernetes.namespace_name = w.options().kubernetes.namespace_name;
    sc.kubernetes.label_selector = w.options().kubernetes.label_selector;
    sc.kubernetes.prefill_selector = w.options().kubernetes.prefill_selector.text;
    sc.kubernetes.decode_selector = w.options().kubernetes.decode_selector.text;
    sc.kubernetes.state = w.state();
    sc.kubernetes.watching = w.status().watching.load(std::memory_order_relaxed);
    sc.kubernetes.resource_version = w.resource_version();
    sc.kubernetes.pods = w.status().pods.load(std::memory_order_relaxed);
    sc.kubernetes.last_error = w.last_error();
  }
  cache.body = render_status_json(snapshot, now, sc);
  cache.valid = true;
  cache.registry_version = snapshot.version;
  cache.reloads = reloads;
  cache.rendered_at = now;
  status_renders_.fetch_add(1, std::memory_order_relaxed);
  return http::Response::json(200, cache.body);
}

http::Response ControlRoutes::debug_cache(const http::Request& request) const {
  return debug_cache_response(request.query,
                              context_.kv_events != nullptr ? &context_.kv_events->index() : nullptr);
}

http::Response ControlRoutes::debug_route(const http::Request& request) const {
  if (context_.route_decisions == nullptr) {
    return http::error_response(404, "no routing decisions are recorded here", "invalid_request_error", "not_found");
  }
  return context_.route_decisions->render(request.query);
}

http::Response ControlRoutes::metrics(uint32_t worker) const {
  MetricsWriter out;
  TopologyMetrics topology;
  if (context_.topology != nullptr) {
    topology.reloads_ok = context_.topology->reloads_ok();
    topology.reloads_failed = context_.topology->reloads_failed();
  }
  write_discovery_metrics(out, *context_.discovery_counters, registry(worker), topology);
  write_node_load_metrics(out, registry(worker), discovery::Clock::now());
  write_node_engine_load_metrics(out, registry(worker), discovery::Clock::now());
  if (context_.http_stats != nullptr) write_http_metrics(out, *context_.http_stats);
  if (context_.proxy_counters != nullptr) proxy::write_proxy_metrics(out, *context_.proxy_counters);
  if (context_.route_decisions != nullptr) {
    context_.route_decisions->write_metrics(out);
  } else {
    const routing::RouteDecisionLog none;
    none.write_metrics(out);
  }
  write_admin_metrics(out, admin_.counters());
  write_kv_events_metrics(out, context_.kv_events);
  write_prefix_tree_metrics(out, context_.prefix_tree);
  write_etcd_metrics(out, context_.replicator);
  write_upstream_tls_metrics(out);
  if (context_.tls != nullptr) {
    context_.tls->write_metrics(out);
  } else {
    TlsContexts().write_metrics(out);  // the families, at zero
  }
  tracing::write_tracing_metrics(out, context_.tracer != nullptr ? &context_.tracer->exporter() : nullptr,
                                 context_.tracer != nullptr ? context_.tracer->invalid_traceparents() : 0);
  write_kubernetes_metrics(out, context_.pod_watcher);
  proxy::write_engine_metrics_metrics(out);
  proxy::write_health_generate_metrics(out);
  clients::write_client_metrics(out, context_.client_gate);
  clients::write_access_log_metrics(out, context_.access_log);
  return http::Response::text(200, out.text(), "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace pdr::router
