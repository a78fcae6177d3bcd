// pdrouter: the P/D router process. Wires the pieces together and owns the control loop:
//   main thread      libuv loop: SIGINT/SIGTERM (graceful stop), SIGHUP + file watch (reload)
//   discovery thread ZMQ ROUTER listener -> registry snapshots        (discovery/)
//   kv_events thread ZMQ SUB to each node's KV events -> block index    (router/cache/; optional)
//   N HTTP workers   P/D proxying (router/proxy/), /health, /status, /metrics, admin API
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <csignal>
#include <CLI/CLI.hpp>
#include <cstdio>
#include "base/log.h"
#include <thread>

#include "discovery/discovery_service.h"
#include "config/topology_store.h"
#include "router/control_routes.h"
#include "router/conversation_mirror.h"
#include "http/fd_budget.h"
#include "http/http_server.h"
#include "http/json_error.h"
#include "http/tls_client.h"
#include "router/cache/kv_events_subscriber.h"
#include "router/cache/prefix_tree.h"
#include "discovery/sources/etcd/registry_replicator.h"
#include "discovery/sources/kubernetes/pod_watcher.h"
#include "router/clients/access_log.h"
#include "router/proxy/proxy_service.h"
#include "router/route_table.h"
#include "router/tls_contexts.h"
#include "router/topology_watcher.h"
#include "router/tracing/span_exporter.h"
#include "router/tracing/tracer.h"

namespace pdr {
namespace {

// Connections the operator listener (listeners.admin) holds at once; within the fd headroom.
constexpr uint32_t kAdminMaxConnections = 64;

struct CommandLine {
  std::string config_path;
  std::string http;       // overrides listeners.http
  std::string discovery;  // overrides listeners.discovery
  uint32_t workers = 0;   // overrides workers when set
  bool workers_set = false;
  std::string log_level = "info";
};

// --help's footer: the endpoint list comes from the route table (router/route_table.cc).
std::string help_footer() {
  return "Endpoints (METHOD PATH LISTENER what):\n" + router::RouteTable::pdrouter().help_text() +
         R"(
The P/D endpoints split each request into a prefill and a decode leg for the pair's connector
(NIXL, MoRIIO READ/WRITE, Mooncake, P2P-NCCL, SGLang). The admin API (/admin/...) takes the key
from admin.api_key_env or admin.api_key_file, as Bearer or X-API-Key. Unknown paths answer 404,
a method a path does not accept 405 with Allow. HEAD is answered on every GET route (the GET
answer's status and headers, no body). With listeners.admin set, the routes marked admin
are served only on that listener and those marked client only on listeners.http (404 on the
other); both serve the ones marked both. Without it, listeners.http serves every route.
limits.max_concurrent_requests (429 with Retry-After) and limits.max_buffered_bytes cover the
P/D endpoints and the one-node ones (render, tokenize, detokenize, pooling, audio, pass-through)
together.

Nodes register over ZMQ (DEALER -> our ROUTER) with vLLM's MoRIIO or P2P-NCCL messages, or
pdrouter's extended format (see proto/DISCOVERY.md); `pdnode register` does it for any node.

Client keys: with client_auth.keys_file in the topology every client route but /health and
/ready needs one of its keys, as Authorization: Bearer or x-api-key (401 otherwise); each key
names a tenant, whose limits (tenants:) answer 429 with Retry-After. access_log.path writes one
JSON line per client request.

Signals: SIGTERM/SIGINT stop gracefully (in-flight requests drain for timeouts.drain_ms);
SIGHUP reloads the topology file and the client key file (both are also reloaded when they
change) and reopens the access log; SIGUSR1 reopens the access log only (logrotate). A reload
that fails validation is logged, counted, and the running configuration is kept.

On start pdrouter prints one line to stdout:
  pdrouter listening http=HOST:PORT discovery=ENDPOINT [admin=HOST:PORT]
Exit codes: 0 after a graceful stop, 1 on a start-up failure, 2 on bad flags or topology.)";
}

Status apply_overrides(const CommandLine& cli, config::Topology* t) {
  if (!cli.http.empty()) {
    proto::HostPort hp;
    if (cli.http.size() > 2 && cli.http.compare(cli.http.size() - 2, 2, ":0") == 0) {
      // Port 0 (ephemeral) is valid for listening though not for a node address.
      Status st = proto::parse_host(cli.http.substr(0, cli.http.size() - 2), &hp.host);
      if (!st.is_ok()) return Status(st.code(), "--http: " + st.message());
    } else if (Status st = proto::parse_host_port(cli.http, &hp); !st.is_ok()) {
      return Status(st.code(), "--http: " + st.message());
    }
    t->listeners.http = hp;
  }
  if (!cli.discovery.empty()) t->listeners.discovery = cli.discovery;
  if (cli.workers_set) t->workers = cli.workers;
  return Status::ok();
}

uint32_t worker_count(const config::Topology& t) {
  if (t.workers > 0) return t.workers;
  return std::max(1u, std::thread::hardware_concurrency());
}

http::ServerOptions server_options(const config::Topology& t) {
  http::ServerOptions o;
  o.host = t.listeners.http.host;
  o.port = t.listeners.http.port;
  o.workers = worker_count(t);
  o.max_header_bytes = t.limits.max_header_bytes;
  o.max_body_bytes = t.limits.max_body_bytes;
  o.header_read_timeout = t.timeouts.header_read;
  o.body_read_timeout = t.timeouts.body_read;
  o.keep_alive_idle = t.timeouts.keep_alive_idle;
  o.max_connections = t.limits.max_connections;
  return o;
}

// Each client request holds up to three sockets (client, prefill, decode) plus pooled idle
// connections, so the usual soft limit of 1024 descriptors would cap pdrouter near 300
// concurrent requests. Raise the soft limit to the hard one, as nginx's worker_rlimit_nofile does.
void raise_fd_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
    pdr::log::debug("open-file limit raised from {} to {}", before, limit.rlim_cur);
  }
}

// Client connections beyond what RLIMIT_NOFILE can hold (with two upstream legs per request
// in flight) would fail with EMFILE at random places, and used to get healthy nodes ejected:
// accept fewer and say what to raise.
void fit_fd_limit(const config::Topology& t, http::ServerOptions* o) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return;
  const http::FdBudget b =
      http::fit_fd_limit(limit.rlim_cur, t.limits.max_connections, t.limits.max_concurrent_requests);
  if (!b.clamped) return;
  pdr::log::warn(
      "open-file limit {} cannot hold limits.max_connections {} plus 2 upstream sockets for each of "
      "limits.max_concurrent_requests {} (about {} descriptors): accepting at most {} connections; "
      "raise the limit (ulimit -n, systemd LimitNOFILE=) to {} or lower those limits",
      limit.rlim_cur, t.limits.max_connections, t.limits.max_concurrent_requests, b.needed, b.max_connections,
      b.needed);
  o->max_connections = b.max_connections;
}

void setup_logging(const std::string& level) {
  pdr::log::log_to_stderr("pdrouter", pdr::log::level_from_name(level).value_or(pdr::log::Level::kInfo),
                          /*timestamps=*/true);
}

// One request on a listener of `surface`: routed by the route table.
void dispatch(router::Surface surface, const router::ControlRoutes& routes, router::proxy::ProxyService& proxy,
              http::Request&& req, http::ResponseWriter w) {
  router::RouteTable::pdrouter().dispatch(surface, router::Endpoints{&routes, &proxy}, std::move(req),
                                          std::move(w));
}

// Everything the control loop's callbacks need.
struct Process {
  CommandLine cli;
  config::TopologyStore topology;
  SnapshotCell<discovery::RegistrySnapshot> registry;
  discovery::DiscoveryCounters discovery_counters;
  discovery::DiscoveryService discovery{registry, discovery_counters};
  // kv_events.enabled only; declared before the servers so it outlives their workers.
  std::unique_ptr<router::cache::BlockIndex> block_index;
  std::unique_ptr<router::cache::KvEventsSubscriber> kv_events;
  // Where pdrouter routed earlier text prompts (cache_aware); made at start, empty until used.
  std::unique_ptr<router::cache::PrefixTree> prefix_tree;
  // TLS contexts of the listeners and of the legs to nodes, remade on reload.
  router::TlsContexts tls;
  // tracing.endpoint set only; declared before the servers so it outlives their workers.
  std::unique_ptr<router::tracing::SpanExporter> span_exporter;
  std::unique_ptr<router::tracing::Tracer> tracer;
  // registry.backend: etcd only; destroyed before the discovery service it posts to.
  std::unique_ptr<discovery::sources::etcd::RegistryReplicator> replicator;
  // kubernetes.enabled only; destroyed before the discovery service it posts to.
  std::unique_ptr<discovery::sources::kubernetes::PodWatcher> pod_watcher;
  // Client request lines (access_log.path); before the proxy services, whose sessions log to it.
  router::clients::AccessLog access_log;
  // Declared before the server so it outlives the worker threads (their on_worker_stop uses it).
  std::unique_ptr<router::proxy::ProxyService> proxy;
  http::Server server;
  // The operator listener (listeners.admin), when configured; the same ordering rule.
  std::unique_ptr<router::proxy::ProxyService> admin_proxy;
  http::Server admin_server;
  uv_loop_t* loop = nullptr;
  uv_signal_t sigint{}, sigterm{}, sigusr1{};
  std::unique_ptr<router::TopologyWatcher> watcher;
  bool stopping = false;
};

void on_stop_signal(uv_signal_t* handle, int signum) {
  auto* p = static_cast<Process*>(handle->data);
  if (p->stopping) return;
  p->stopping = true;
  const auto drain = p->topology.current()->timeouts.drain;
  pdr::log::info("{} received: draining for up to {} ms, then stopping", signum == SIGINT ? "SIGINT" : "SIGTERM",
               drain.count());
  p->proxy->begin_shutdown();  // new P/D requests get 503 while in-flight ones finish
  if (p->admin_proxy) p->admin_proxy->begin_shutdown();
  p->server.stop(drain);
  p->admin_server.stop(std::min(drain, std::chrono::milliseconds(2000)));
  if (p->replicator) p->replicator->stop();  // revokes its lease: other replicas drop its entries
  if (p->pod_watcher) p->pod_watcher->stop();
  p->discovery.stop();
  if (p->kv_events) p->kv_events->stop();
  if (p->span_exporter) p->span_exporter->stop();  // the drained requests' spans leave first
  if (p->watcher) p->watcher->close();
  uv_close(reinterpret_cast<uv_handle_t*>(&p->sigint), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&p->sigterm), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&p->sigusr1), nullptr);
}

// logrotate's postrotate (as for nginx): the access log is reopened at its configured path.
void on_reopen_signal(uv_signal_t* handle, int) {
  auto* p = static_cast<Process*>(handle->data);
  pdr::log::info("SIGUSR1: reopening the access log");
  p->access_log.reopen();
}

// The files a topology reads that the watcher must follow besides itself.
std::vector<std::string> watched_files(const config::Topology& t) {
  std::vector<std::string> files;
  if (!t.client_auth.keys_path.empty()) files.push_back(t.client_auth.keys_path);
  return files;
}

int run(Process& p) {
  setup_logging(p.cli.log_level);
  raise_fd_limit();
  if (Status st = p.topology.load_initial(p.cli.config_path); !st.is_ok()) {
    std::fprintf(stderr, "pdrouter: %s\n", st.message().c_str());
    return 2;
  }
  config::Topology topology = *p.topology.current();
  if (Status st = apply_overrides(p.cli, &topology); !st.is_ok()) {
    std::fprintf(stderr, "pdrouter: %s\n", st.message().c_str());
    return 2;
  }

  // Checked again after the command line's overrides (the file alone passed parse_topology).
  if (topology.discovery.open_to_network(topology.listeners.discovery, topology.listeners.discovery_curve)) {
    if (!topology.discovery.allow_open) {
      std::fprintf(stderr,
                   "pdrouter: discovery on %s admits every address (discovery.allowed_peers covers all of "
                   "them): anyone who reaches it could register nodes that receive client prompts. List "
                   "your node networks in discovery.allowed_peers, or set discovery.allow_open: true\n",
                   topology.listeners.discovery.c_str());
      return 2;
    }
    pdr::log::warn("discovery is OPEN to the network on {} (discovery.allow_open): any host that reaches it "
                 "can register nodes that receive client traffic", topology.listeners.discovery);
  }

  // Anyone who reaches a client listener beyond this machine may send prompts in any tenant's
  // name while there are no client keys; the quick start runs so, on purpose.
  if (!topology.client_auth.enabled() && !proto::names_loopback(topology.listeners.http.host)) {
    pdr::log::warn("the client listener {} is reachable beyond this machine and client_auth.keys_file is not set: "
                   "anyone who reaches it can send requests; set client_auth.keys_file (README, Security)",
                   topology.listeners.http.to_string());
  }

  // Two listeners on one port would both bind (SO_REUSEPORT) and split connections silently.
  if (topology.listeners.admin && topology.listeners.admin->port != 0 &&
      topology.listeners.admin->port == topology.listeners.http.port) {
    std::fprintf(stderr, "pdrouter: listeners.admin (%s) must use another port than the http listener (%s)\n",
                 topology.listeners.admin->to_string().c_str(), topology.listeners.http.to_string().c_str());
    return 2;
  }

  // Certificates and keys are parsed here, before anything starts: an unusable file is a bad
  // topology (exit 2), as a wrong key name is.
  if (Status st = p.tls.build(topology); !st.is_ok()) {
    std::fprintf(stderr, "pdrouter: %s\n", st.message().c_str());
    return 2;
  }

  // Threads started from here on inherit a mask without the control signals, so they are always
  // delivered to this (the control loop's) thread and never interrupt a worker's system call.
  sigset_t control_signals, previous_mask;
  sigemptyset(&control_signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&control_signals, sig);
  pthread_sigmask(SIG_BLOCK, &control_signals, &previous_mask);

  if (Status st = p.discovery.start(discovery::DiscoveryServiceOptions::from(topology)); !st.is_ok()) {
    pdr::log::critical("{}", st.message());
    return 1;
  }
  if (topology.kv_events.enabled) {
    // The subscription list follows the registry; topic, default port, the index budget and the
    // per-node bounds are read once here (restart_required_changes lists a reload that changes them).
    p.block_index = std::make_unique<router::cache::BlockIndex>(topology.kv_events.max_index_entries);
    p.kv_events = std::make_unique<router::cache::KvEventsSubscriber>(p.registry, *p.block_index);
    router::cache::KvEventsSubscriberOptions kv_options;
    kv_options.topic = topology.kv_events.topic;
    kv_options.default_port = topology.kv_events.default_port;
    kv_options.max_node_batches_per_sec = topology.kv_events.max_node_batches_per_sec;
    kv_options.max_node_bytes_per_sec = topology.kv_events.max_node_bytes_per_sec;
    kv_options.max_ranks_per_node = topology.kv_events.max_ranks_per_node;
    kv_options.max_subscriptions = topology.kv_events.max_subscriptions;
    if (Status kst = p.kv_events->start(kv_options); !kst.is_ok()) {
      pdr::log::critical("{}", kst.message());
      p.discovery.stop();
      return 1;
    }
  }
  if (topology.registry.backend == "etcd") {
    // Endpoints, prefix, replica id and lease are read once here.
    discovery::sources::etcd::RegistryReplicatorOptions etcd_options;
    etcd_options.etcd.endpoints = topology.registry.etcd_endpoints;
    etcd_options.etcd.user = topology.registry.etcd_user;
    etcd_options.etcd.password = topology.registry.etcd_password;
    if (topology.registry.etcd_tls) {
      http::TlsClientOptions tls;
      tls.ca_pem = topology.registry.etcd_ca_pem;
      tls.cert_pem = topology.registry.etcd_cert_pem;
      tls.key_pem = topology.registry.etcd_key_pem;
      if (Status tst = http::TlsClientContext::create(tls, &etcd_options.etcd.tls); !tst.is_ok()) {
        pdr::log::critical("registry: etcd TLS files unusable: {}", tst.message());
        p.discovery.stop();
        return 1;
      }
    }
    etcd_options.prefix = topology.registry.etcd_prefix;
    etcd_options.lease_ttl = topology.registry.lease_ttl;
    etcd_options.replica_id = topology.registry.replica_id;
    if (etcd_options.replica_id.empty()) {
      char host[256] = {};
      if (gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "pdrouter");
      etcd_options.replica_id = std::string(host) + "-" + std::to_string(getpid());
    }
    p.replicator = std::make_unique<discovery::sources::etcd::RegistryReplicator>(p.registry, p.discovery);
    if (Status est = p.replicator->start(etcd_options); !est.is_ok()) {
      pdr::log::critical("{}", est.message());
      p.discovery.stop();
      return 1;
    }
    pdr::log::info("registry shared through etcd at {} (prefix {}, replica {})",
                 topology.registry.etcd_endpoints.front().to_string(), etcd_options.prefix, etcd_options.replica_id);
  }
  if (topology.kubernetes.enabled) {
    // Read once here (a reload that changes the kubernetes section needs a restart).
    discovery::sources::kubernetes::PodWatcherOptions k8s_options;
    k8s_options.kubernetes = topology.kubernetes;
    k8s_options.connectors = topology.connectors;
    if (topology.kubernetes.api_server_tls) {
      http::TlsClientOptions tls;
      tls.ca_pem = topology.kubernetes.ca_pem;  // "" = the system's CAs
      if (Status tst = http::TlsClientContext::create(tls, &k8s_options.tls); !tst.is_ok()) {
        pdr::log::critical("kubernetes: ca_file unusable: {}", tst.message());
        if (p.replicator) p.replicator->stop();
        p.discovery.stop();
        return 1;
      }
    }
    p.pod_watcher = std::make_unique<discovery::sources::kubernetes::PodWatcher>(p.discovery);
    if (Status kst = p.pod_watcher->start(k8s_options); !kst.is_ok()) {
      pdr::log::critical("{}", kst.message());
      if (p.replicator) p.replicator->stop();
      p.discovery.stop();
      return 1;
    }
    const auto& k8s = topology.kubernetes;
    // With role selectors the role comes from them, not from role_label: the line says which.
    const std::string roles = k8s.uses_selectors() ? " prefill_selector '" + k8s.prefill_selector.text +
                                                         "' decode_selector '" + k8s.decode_selector.text + "'"
                                                   : std::string();
    pdr::log::info("kubernetes pod discovery: {} namespace {} selector '{}'{}", k8s.api_server_url,
                   k8s.namespace_name, k8s.label_selector, roles);
  }
  http::ServerOptions server_opts = server_options(topology);
  fit_fd_limit(topology, &server_opts);
  server_opts.tls = p.tls.client_listener();
  if (topology.tracing.enabled()) {
    // Read once here (restart_required_changes lists a reload that changes them); the sampling
    // ratio is read per request.
    router::tracing::ExporterOptions trace_options;
    trace_options.collector = topology.tracing.collector;
    trace_options.path = topology.tracing.collector_path;
    trace_options.service_name = topology.tracing.service_name;
    trace_options.max_queue_spans = topology.tracing.max_queue_spans;
    trace_options.batch = topology.tracing.batch;
    trace_options.max_batch_spans = topology.tracing.max_batch_spans;
    trace_options.export_timeout = topology.tracing.export_timeout;
    p.span_exporter = std::make_unique<router::tracing::SpanExporter>();
    (void)p.span_exporter->start(trace_options);
    p.tracer = std::make_unique<router::tracing::Tracer>(*p.span_exporter);
  }
  p.proxy = std::make_unique<router::proxy::ProxyService>(p.registry, p.topology.cell(), p.server,
                                                          server_opts.workers);
  p.tls.attach_proxy(p.proxy.get());
  p.proxy->use_tracer(p.tracer.get());
  p.prefix_tree = std::make_unique<router::cache::PrefixTree>(topology.policies.cache_aware.prefix_tree_max_bytes,
                                                              topology.policies.cache_aware.prefix_tree_prompt_bytes);
  p.proxy->use_cache(p.block_index.get(), p.prefix_tree.get());
  p.access_log.configure(topology.access_log.path, topology.access_log.max_queued_lines);
  p.proxy->use_access_log(&p.access_log);
  server_opts.on_worker_stop = [proxy = p.proxy.get()](uint32_t worker) { proxy->worker_stopped(worker); };
  server_opts.body_budget = p.proxy.get();  // bodies charged to limits.max_buffered_bytes as they are read
  router::ControlContext control;
  control.registry = &p.registry;
  control.discovery_counters = &p.discovery_counters;
  control.topology = &p.topology;
  control.http_stats = &p.server.stats();
  control.proxy_counters = &p.proxy->counters();
  control.discovery = &p.discovery;
  control.server = &p.server;
  control.discovery_listener = p.discovery.bound_endpoint();
  control.discovery_curve_listener = p.discovery.bound_curve_endpoint();
  control.discovery_open =
      topology.discovery.open_to_network(topology.listeners.discovery, topology.listeners.discovery_curve);
  control.workers = server_opts.workers;
  control.kv_events = p.kv_events.get();
  control.prefix_tree = p.prefix_tree.get();
  control.replicator = p.replicator.get();
  control.pod_watcher = p.pod_watcher.get();
  control.client_gate = &p.proxy->gate();
  control.access_log = &p.access_log;
  control.tls = &p.tls;
  control.tracer = p.tracer.get();
  // The routes show the bound port, known only after start(): they are published just after it,
  // and a request that races in before (fixed port, eager client) gets a clear 503.
  std::atomic<const router::ControlRoutes*> routes_ptr{nullptr};
  router::proxy::ProxyService* proxy = p.proxy.get();
  const router::Surface client_surface =
      topology.listeners.admin ? router::Surface::kClient : router::Surface::kAll;
  Status st = p.server.start(server_opts, [&routes_ptr, proxy, client_surface](http::Request&& req,
                                                                                 http::ResponseWriter w) {
    const router::ControlRoutes* routes = routes_ptr.load(std::memory_order_acquire);
    if (routes == nullptr) {
      w.send(http::error_response(503, "pdrouter is starting", "server_error", "starting"));
      return;
    }
    dispatch(client_surface, *routes, *proxy, std::move(req), std::move(w));
  });
  if (!st.is_ok()) {
    pdr::log::critical("cannot listen on {}: {}", topology.listeners.http.to_string(), st.message());
    p.discovery.stop();
    return 1;
  }
  proto::HostPort bound_http{server_opts.host, p.server.port()};
  control.http_listener = bound_http.to_string();
  const router::ControlRoutes routes(control);
  routes_ptr.store(&routes, std::memory_order_release);

  // The operator listener: one worker (operators, not clients), its own routes (their per-worker
  // state is indexed by this server's worker ids) and its own proxy service for profiling.
  std::atomic<const router::ControlRoutes*> admin_routes_ptr{nullptr};
  std::unique_ptr<router::ControlRoutes> admin_routes;
  std::string admin_listener;
  if (topology.listeners.admin) {
    http::ServerOptions admin_opts = server_opts;
    admin_opts.body_budget = nullptr;  // the client proxy's budget is tied to the client server's workers
    admin_opts.host = topology.listeners.admin->host;
    admin_opts.port = topology.listeners.admin->port;
    admin_opts.workers = 1;
    // The operator listener has a cap of its own: limits.max_connections sizes the client
    // listener, and clients holding all of it must not lock operators out of /metrics and
    // /status. Its descriptors come out of the fd budget's headroom (http/fd_budget.h).
    admin_opts.max_connections = kAdminMaxConnections;
    admin_opts.tls = p.tls.admin_listener();
    p.admin_proxy = std::make_unique<router::proxy::ProxyService>(p.registry, p.topology.cell(),
                                                                  p.admin_server, admin_opts.workers);
    p.tls.attach_proxy(p.admin_proxy.get());
    p.admin_proxy->count_profiles_in(*p.proxy);
    admin_opts.on_worker_stop = [admin_proxy = p.admin_proxy.get()](uint32_t worker) {
      admin_proxy->worker_stopped(worker);
    };
    router::proxy::ProxyService* admin_proxy = p.admin_proxy.get();
    st = p.admin_server.start(admin_opts, [&admin_routes_ptr, admin_proxy](http::Request&& req,
                                                                           http::ResponseWriter w) {
      const router::ControlRoutes* r = admin_routes_ptr.load(std::memory_order_acquire);
      if (r == nullptr) {
        w.send(http::error_response(503, "pdrouter is starting", "server_error", "starting"));
        return;
      }
      dispatch(router::Surface::kAdmin, *r, *admin_proxy, std::move(req), std::move(w));
    });
    if (!st.is_ok()) {
      pdr::log::critical("cannot listen on {} (listeners.admin): {}", topology.listeners.admin->to_string(),
                       st.message());
      p.server.stop(std::chrono::milliseconds(0));
      p.discovery.stop();
      return 1;
    }
    admin_listener = proto::HostPort{admin_opts.host, p.admin_server.port()}.to_string();
    router::ControlContext admin_control = control;
    admin_control.server = &p.admin_server;
    admin_control.workers = admin_opts.workers;
    admin_routes = std::make_unique<router::ControlRoutes>(admin_control);
    admin_routes_ptr.store(admin_routes.get(), std::memory_order_release);
  }
  p.tls.attach_servers(&p.server, topology.listeners.admin ? &p.admin_server : nullptr);
  // Multi-turn entries shared with the other replicas (registry.backend: etcd). Here, past the
  // last early return: from now on the stop signal stops the replicator before the cache goes.
  if (p.replicator) router::mirror_conversations(*p.replicator, p.proxy->conversations(), p.topology.cell());

  p.topology.add_listener([&p](const config::Topology& old_t, const config::Topology& new_t) {
    for (const auto& change : config::restart_required_changes(old_t, new_t)) {
      pdr::log::warn("topology: {} takes effect only after a restart", change);
    }
    config::Topology effective = new_t;
    (void)apply_overrides(p.cli, &effective);  // validated at start-up
    p.discovery.apply_topology(effective);
    // A reload (SIGHUP) also reopens the access log; a changed key file path is watched.
    p.access_log.configure(new_t.access_log.path, new_t.access_log.max_queued_lines);
    p.access_log.reopen();
    if (p.watcher) p.watcher->watch_also(watched_files(new_t));
    p.tls.reload(new_t);  // renewed certificates: new handshakes use them
    pdr::log::info("topology reloaded from {} ({} static instances)", p.topology.path(),
                 new_t.static_instances.size());
  });

  p.loop = uv_default_loop();
  p.sigint.data = p.sigterm.data = p.sigusr1.data = &p;
  uv_signal_init(p.loop, &p.sigint);
  uv_signal_init(p.loop, &p.sigterm);
  uv_signal_init(p.loop, &p.sigusr1);
  uv_signal_start(&p.sigint, on_stop_signal, SIGINT);
  uv_signal_start(&p.sigterm, on_stop_signal, SIGTERM);
  uv_signal_start(&p.sigusr1, on_reopen_signal, SIGUSR1);
  p.watcher = std::make_unique<router::TopologyWatcher>(p.loop, p.topology);
  if (Status wst = p.watcher->start(); !wst.is_ok()) {
    // Still serving; SIGHUP-free operation only loses live reload, which the log says.
    pdr::log::error("topology: live reload disabled: {}", wst.message());
  }
  p.watcher->watch_also(watched_files(*p.topology.current()));
  pthread_sigmask(SIG_SETMASK, &previous_mask, nullptr);  // handlers are in place: let them in
  // Announce readiness last: once this line is out, every listener, the reload watcher and the
  // signal handlers are armed, so a client or a file change that follows it is never missed.
  std::printf("pdrouter listening http=%s discovery=%s%s%s\n", control.http_listener.c_str(),
              control.discovery_listener.c_str(), admin_listener.empty() ? "" : " admin=",
              admin_listener.c_str());
  std::fflush(stdout);
  pdr::log::info("pdrouter {} up: http {} ({} workers), admin {}, discovery {}, topology {}", PDR_VERSION,
               control.http_listener, server_opts.workers,
               admin_listener.empty() ? "on the http listener" : admin_listener, control.discovery_listener,
               p.topology.path().empty() ? "defaults" : p.topology.path());
  uv_run(p.loop, UV_RUN_DEFAULT);
  uv_loop_close(p.loop);
  pdr::log::info("pdrouter stopped");
  return 0;
}

}  // namespace
}  // namespace pdr

int main(int argc, char** argv) {
  // A peer that closes while we write must be an EPIPE error on that connection, not the end
  // of the process.
  std::signal(SIGPIPE, SIG_IGN);
  pdr::Process process;
  CLI::App app{"pdrouter " PDR_VERSION
               ": a router for disaggregated prefill/decode LLM serving with vLLM and SGLang.\n"
               "Nodes register over ZeroMQ; clients use the OpenAI-style HTTP API."};
  auto& cli = process.cli;
  app.add_option("-c,--config", cli.config_path,
                 "YAML topology file (every key: deploy/topology.example.yaml). Reloaded on change and "
                 "on SIGHUP. Without it, built-in defaults apply.")
      ->check(CLI::ExistingFile);
  app.add_option("--http", cli.http,
                 "HTTP listen address HOST:PORT; overrides listeners.http (default 0.0.0.0:10001; "
                 "port 0 picks a free port, printed on start)");
  app.add_option("--discovery", cli.discovery,
                 "ZMQ endpoint nodes register with; overrides listeners.discovery (default "
                 "tcp://*:36367, the port vLLM's MoRIIO proxy uses; tcp://HOST:0 picks a free port)");
  app.add_option_function<uint32_t>(
         "--workers", [&cli](const uint32_t& n) { cli.workers = n; cli.workers_set = true; },
         "HTTP worker threads; overrides workers (0 = one per core)")
      ->check(CLI::Range(0u, 256u));
  app.add_option("--log-level", cli.log_level, "trace, debug, info, warn, error (default info)")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.set_version_flag("--version", "pdrouter " PDR_VERSION);
  app.footer(pdr::help_footer());
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return pdr::run(process);
}
