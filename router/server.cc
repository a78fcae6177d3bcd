#include "router/server.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <utility>

#include "proto/base/log.h"
#include "router/http/fd_budget.h"
#include "router/http/json_error.h"
#include "router/http/tls_client.h"
#include "router/conversation_mirror.h"
#include "router/session_mirror.h"
#include "router/route_table.h"

namespace pdr::router {
namespace {

// Connections the operator listener (listeners.admin) holds at once; within the fd headroom.
constexpr uint32_t kAdminMaxConnections = 64;

Status apply_overrides(const ServerFlags& flags, config::Topology* t) {
  if (!flags.http.empty()) {
    proto::HostPort hp;
    if (flags.http.size() > 2 && flags.http.compare(flags.http.size() - 2, 2, ":0") == 0) {
      // Port 0 (ephemeral) is valid for listening though not for a node address.
      Status st = proto::parse_host(flags.http.substr(0, flags.http.size() - 2), &hp.host);
      if (!st.is_ok()) return Status(st.code(), "--http: " + st.message());
    } else if (Status st = proto::parse_host_port(flags.http, &hp); !st.is_ok()) {
      return Status(st.code(), "--http: " + st.message());
    }
    t->listeners.http = hp;
  }
  if (!flags.discovery.empty()) t->listeners.discovery = flags.discovery;
  if (flags.workers_set) t->workers = flags.workers;
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

// One request on a listener of `surface`: routed by the route table. Before the listener's
// routes are published (they show its bound port) a request gets a clear 503.
void dispatch(Surface surface, const std::atomic<const ControlRoutes*>& routes_ptr, proxy::ProxyService& proxy,
              http::Request&& req, http::ResponseWriter w) {
  const ControlRoutes* routes = routes_ptr.load(std::memory_order_acquire);
  if (routes == nullptr) {
    w.send(http::error_response(503, "pdrouter is starting", "server_error", "starting"));
    return;
  }
  RouteTable::pdrouter().dispatch(surface, Endpoints{routes, &proxy}, std::move(req), std::move(w));
}

// The files a topology reads that the watcher must follow besides itself.
std::vector<std::string> watched_files(const config::Topology& t) {
  std::vector<std::string> files;
  if (!t.client_auth.keys_path.empty()) files.push_back(t.client_auth.keys_path);
  return files;
}

void bad_configuration(const std::string& message) { std::fprintf(stderr, "pdrouter: %s\n", message.c_str()); }

}  // namespace

Server::Server(ServerFlags flags) : flags_(std::move(flags)) {}

Server::~Server() {
  unwind();
  // start() failed past making the loop, or run() was never called: finish the handles' closes.
  if (loop_ != nullptr) {
    uv_run(loop_, UV_RUN_DEFAULT);
    uv_loop_close(loop_);
  }
}

void Server::started(const char* name, std::function<void()> stop) {
  stages_.push_back(Stage{name, std::move(stop)});
}

void Server::unwind() {
  while (!stages_.empty()) {
    Stage stage = std::move(stages_.back());
    stages_.pop_back();
    stage.stop();
  }
}

Server::StartResult Server::start() {
  raise_fd_limit();
  config::Topology topology;
  if (StartResult r = check_configuration(&topology); r != StartResult::kStarted) return r;

  // Certificates and keys are parsed here, before anything starts: an unusable file is a bad
  // topology (exit 2), as a wrong key name is.
  if (Status st = tls_.build(topology); !st.is_ok()) {
    bad_configuration(st.message());
    return StartResult::kBadConfiguration;
  }

  block_control_signals();
  // The sources of the registry and what follows it, in order; each failure says what failed.
  using Stage = Status (Server::*)(const config::Topology&);
  for (Stage stage : {&Server::start_discovery, &Server::start_kv_events, &Server::start_replicator,
                      &Server::start_pod_watcher}) {
    if (Status st = (this->*stage)(topology); !st.is_ok()) {
      pdr::log::critical("{}", st.message());
      return StartResult::kFailed;
    }
  }
  server_options_ = server_options(topology);
  fit_fd_limit(topology, &server_options_);
  server_options_.tls = tls_.client_listener();
  start_tracing(topology);
  make_proxy(topology);
  // Before the servers start: the workers' /metrics reads these pointers, and only what precedes
  // the routes' publication is ordered before their reads.
  tls_.attach_servers(&server_, topology.listeners.admin ? &admin_server_ : nullptr);
  if (Status st = start_http(topology); !st.is_ok()) {
    pdr::log::critical("cannot listen on {}: {}", topology.listeners.http.to_string(), st.message());
    return StartResult::kFailed;
  }
  if (Status st = start_admin(topology); !st.is_ok()) {
    pdr::log::critical("cannot listen on {} (listeners.admin): {}", topology.listeners.admin->to_string(),
                       st.message());
    return StartResult::kFailed;
  }
  // Multi-turn entries shared with the other replicas (registry.backend: etcd). The replicator's
  // stage stops it before any part is freed, so the cache it mirrors into outlives it.
  // Session affinity's bindings share the same feed (router/session_mirror.h).
  if (replicator_) {
    mirror_shared_entries(*replicator_, proxy_->conversations(), proxy_->sessions(), proxy_->session_counters(),
                          topology_.cell());
  }
  topology_.add_listener(
      [this](const config::Topology& old_t, const config::Topology& new_t) { on_reload(old_t, new_t); });
  start_control_loop();
  announce();
  return StartResult::kStarted;
}

// The topology file with the command line's overrides, and what only their combination can get
// wrong: each refusal is a bad configuration (exit 2), said on stderr.
Server::StartResult Server::check_configuration(config::Topology* topology) {
  if (Status st = topology_.load_initial(flags_.config_path); !st.is_ok()) {
    bad_configuration(st.message());
    return StartResult::kBadConfiguration;
  }
  *topology = *topology_.current();
  if (Status st = apply_overrides(flags_, topology); !st.is_ok()) {
    bad_configuration(st.message());
    return StartResult::kBadConfiguration;
  }
  const config::Topology& t = *topology;

  // Checked again after the command line's overrides (the file alone passed parse_topology).
  if (t.discovery.open_to_network(t.listeners.discovery, t.listeners.discovery_curve)) {
    if (!t.discovery.allow_open) {
      std::fprintf(stderr,
                   "pdrouter: discovery on %s admits every address (discovery.allowed_peers covers all of "
                   "them): anyone who reaches it could register nodes that receive client prompts. List "
                   "your node networks in discovery.allowed_peers, or set discovery.allow_open: true\n",
                   t.listeners.discovery.c_str());
      return StartResult::kBadConfiguration;
    }
    pdr::log::warn("discovery is OPEN to the network on {} (discovery.allow_open): any host that reaches it "
                   "can register nodes that receive client traffic", t.listeners.discovery);
  }

  // Anyone who reaches a client listener beyond this machine may send prompts in any tenant's
  // name while there are no client keys; the quick start runs so, on purpose.
  if (!t.client_auth.enabled() && !proto::names_loopback(t.listeners.http.host)) {
    pdr::log::warn("the client listener {} is reachable beyond this machine and client_auth.keys_file is not set: "
                   "anyone who reaches it can send requests; set client_auth.keys_file (docs/security.md)",
                   t.listeners.http.to_string());
  }

  // Two listeners on one port would both bind (SO_REUSEPORT) and split connections silently.
  if (t.listeners.admin && t.listeners.admin->port != 0 && t.listeners.admin->port == t.listeners.http.port) {
    std::fprintf(stderr, "pdrouter: listeners.admin (%s) must use another port than the http listener (%s)\n",
                 t.listeners.admin->to_string().c_str(), t.listeners.http.to_string().c_str());
    return StartResult::kBadConfiguration;
  }
  return StartResult::kStarted;
}

// Threads started from here on inherit a mask without the control signals, so they are always
// delivered to the control loop's thread and never interrupt a worker's system call.
void Server::block_control_signals() {
  sigset_t control_signals;
  sigemptyset(&control_signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&control_signals, sig);
  pthread_sigmask(SIG_BLOCK, &control_signals, &previous_mask_);
  started("the control signals' mask", [this] { pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr); });
}

Status Server::start_discovery(const config::Topology& topology) {
  started("the discovery service", [this] { discovery_.stop(); });
  Status st = discovery_.start(discovery::DiscoveryServiceOptions::from(topology));
  if (st.is_ok()) control_.discovery_listener = discovery_.bound_endpoint();
  return st;
}

Status Server::start_kv_events(const config::Topology& topology) {
  if (!topology.kv_events.enabled) return Status::ok();
  // The subscription list follows the registry; topic, default port, the index budget and the
  // per-node bounds are read once here (restart_required_changes lists a reload that changes them).
  block_index_ = std::make_unique<cache::BlockIndex>(topology.kv_events.max_index_entries);
  kv_events_ = std::make_unique<cache::KvEventsSubscriber>(registry_, *block_index_);
  cache::KvEventsSubscriberOptions kv_options;
  kv_options.topic = topology.kv_events.topic;
  kv_options.default_port = topology.kv_events.default_port;
  kv_options.max_node_batches_per_sec = topology.kv_events.max_node_batches_per_sec;
  kv_options.max_node_bytes_per_sec = topology.kv_events.max_node_bytes_per_sec;
  kv_options.max_ranks_per_node = topology.kv_events.max_ranks_per_node;
  kv_options.max_subscriptions = topology.kv_events.max_subscriptions;
  started("the KV events subscriber", [this] { kv_events_->stop(); });
  return kv_events_->start(kv_options);
}

Status Server::start_replicator(const config::Topology& topology) {
  if (topology.registry.backend != "etcd") return Status::ok();
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
      return Status(tst.code(), "registry: etcd TLS files unusable: " + tst.message());
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
  replicator_ = std::make_unique<discovery::sources::etcd::RegistryReplicator>(registry_, discovery_);
  // Its stop revokes the lease: the other replicas drop this one's entries at once.
  started("the etcd registry replicator", [this] { replicator_->stop(); });
  if (Status est = replicator_->start(etcd_options); !est.is_ok()) return est;
  pdr::log::info("registry shared through etcd at {} (prefix {}, replica {})",
                 topology.registry.etcd_endpoints.front().to_string(), etcd_options.prefix, etcd_options.replica_id);
  return Status::ok();
}

Status Server::start_pod_watcher(const config::Topology& topology) {
  if (!topology.kubernetes.enabled) return Status::ok();
  // Read once here (a reload that changes the kubernetes section needs a restart).
  discovery::sources::kubernetes::PodWatcherOptions k8s_options;
  k8s_options.kubernetes = topology.kubernetes;
  k8s_options.connectors = topology.connectors;
  if (topology.kubernetes.api_server_tls) {
    http::TlsClientOptions tls;
    tls.ca_pem = topology.kubernetes.ca_pem;  // "" = the system's CAs
    if (Status tst = http::TlsClientContext::create(tls, &k8s_options.tls); !tst.is_ok()) {
      return Status(tst.code(), "kubernetes: ca_file unusable: " + tst.message());
    }
  }
  pod_watcher_ = std::make_unique<discovery::sources::kubernetes::PodWatcher>(discovery_);
  started("the Kubernetes pod watcher", [this] { pod_watcher_->stop(); });
  if (Status kst = pod_watcher_->start(k8s_options); !kst.is_ok()) return kst;
  const auto& k8s = topology.kubernetes;
  // With role selectors the role comes from them, not from role_label: the line says which.
  const std::string roles = k8s.uses_selectors() ? " prefill_selector '" + k8s.prefill_selector.text +
                                                       "' decode_selector '" + k8s.decode_selector.text + "'"
                                                 : std::string();
  pdr::log::info("kubernetes pod discovery: {} namespace {} selector '{}'{}", k8s.api_server_url,
                 k8s.namespace_name, k8s.label_selector, roles);
  return Status::ok();
}

void Server::start_tracing(const config::Topology& topology) {
  if (!topology.tracing.enabled()) return;
  // Read once here (restart_required_changes lists a reload that changes them); the sampling
  // ratio is read per request.
  tracing::ExporterOptions trace_options;
  trace_options.collector = topology.tracing.collector;
  trace_options.path = topology.tracing.collector_path;
  trace_options.service_name = topology.tracing.service_name;
  trace_options.max_queue_spans = topology.tracing.max_queue_spans;
  trace_options.batch = topology.tracing.batch;
  trace_options.max_batch_spans = topology.tracing.max_batch_spans;
  trace_options.export_timeout = topology.tracing.export_timeout;
  span_exporter_ = std::make_unique<tracing::SpanExporter>();
  // Stopped after the HTTP servers (started later): the drained requests' spans leave first.
  started("the span exporter", [this] { span_exporter_->stop(); });
  (void)span_exporter_->start(trace_options);
  tracer_ = std::make_unique<tracing::Tracer>(*span_exporter_);
}

// The client listener's proxy service and what it uses; the access log's writer thread starts
// with its first configure() and stops with its destructor.
void Server::make_proxy(const config::Topology& topology) {
  proxy_ = std::make_unique<proxy::ProxyService>(registry_, topology_.cell(), server_, server_options_.workers);
  tls_.attach_proxy(proxy_.get());
  proxy_->use_tracer(tracer_.get());
  prefix_tree_ = std::make_unique<cache::PrefixTree>(topology.policies.cache_aware.prefix_tree_max_bytes,
                                                     topology.policies.cache_aware.prefix_tree_prompt_bytes);
  proxy_->use_cache(block_index_.get(), prefix_tree_.get());
  access_log_.configure(topology.access_log.path, topology.access_log.max_queued_lines);
  proxy_->use_access_log(&access_log_);
  server_options_.on_worker_stop = [proxy = proxy_.get()](uint32_t worker) { proxy->worker_stopped(worker); };
  server_options_.body_budget = proxy_.get();  // bodies charged to limits.max_buffered_bytes as they are read
}

void Server::fill_control_context(const config::Topology& topology) {
  control_.started_at = discovery::Clock::now();  // /status uptime: from the listeners' start
  control_.registry = &registry_;
  control_.discovery_counters = &discovery_counters_;
  control_.topology = &topology_;
  control_.http_stats = &server_.stats();
  control_.proxy_counters = &proxy_->counters();
  control_.route_decisions = &proxy_->route_decisions();
  control_.discovery = &discovery_;
  control_.server = &server_;
  control_.discovery_curve_listener = discovery_.bound_curve_endpoint();
  control_.discovery_open =
      topology.discovery.open_to_network(topology.listeners.discovery, topology.listeners.discovery_curve);
  control_.workers = server_options_.workers;
  control_.kv_events = kv_events_.get();
  control_.prefix_tree = prefix_tree_.get();
  control_.replicator = replicator_.get();
  control_.pod_watcher = pod_watcher_.get();
  control_.client_gate = &proxy_->gate();
  control_.access_log = &access_log_;
  control_.tls = &tls_;
  control_.tracer = tracer_.get();
}

Status Server::start_http(const config::Topology& topology) {
  fill_control_context(topology);
  proxy::ProxyService* proxy = proxy_.get();
  const Surface surface = topology.listeners.admin ? Surface::kClient : Surface::kAll;
  started("the HTTP server", [this] { server_.stop(std::chrono::milliseconds(0)); });
  Status st = server_.start(server_options_, [this, proxy, surface](http::Request&& req, http::ResponseWriter w) {
    dispatch(surface, routes_ptr_, *proxy, std::move(req), std::move(w));
  });
  if (!st.is_ok()) return st;
  control_.http_listener = proto::HostPort{server_options_.host, server_.port()}.to_string();
  proxy->start_load_scrape();  // idle until load_signals.scrape_engine_metrics
  routes_ = std::make_unique<ControlRoutes>(control_);
  routes_ptr_.store(routes_.get(), std::memory_order_release);
  return Status::ok();
}

// The operator listener: one worker (operators, not clients), its own routes (their per-worker
// state is indexed by this server's worker ids) and its own proxy service for profiling.
Status Server::start_admin(const config::Topology& topology) {
  if (!topology.listeners.admin) return Status::ok();
  http::ServerOptions admin_opts = server_options_;
  admin_opts.body_budget = nullptr;  // the client proxy's budget is tied to the client server's workers
  admin_opts.host = topology.listeners.admin->host;
  admin_opts.port = topology.listeners.admin->port;
  admin_opts.workers = 1;
  // The operator listener has a cap of its own: limits.max_connections sizes the client
  // listener, and clients holding all of it must not lock operators out of /metrics and
  // /status. Its descriptors come out of the fd budget's headroom (router/http/fd_budget.h).
  admin_opts.max_connections = kAdminMaxConnections;
  admin_opts.tls = tls_.admin_listener();
  admin_proxy_ = std::make_unique<proxy::ProxyService>(registry_, topology_.cell(), admin_server_, admin_opts.workers);
  tls_.attach_proxy(admin_proxy_.get());
  admin_proxy_->count_profiles_in(*proxy_);
  admin_opts.on_worker_stop = [admin_proxy = admin_proxy_.get()](uint32_t worker) {
    admin_proxy->worker_stopped(worker);
  };
  proxy::ProxyService* admin_proxy = admin_proxy_.get();
  started("the admin server", [this] { admin_server_.stop(std::chrono::milliseconds(0)); });
  Status st = admin_server_.start(admin_opts, [this, admin_proxy](http::Request&& req, http::ResponseWriter w) {
    dispatch(Surface::kAdmin, admin_routes_ptr_, *admin_proxy, std::move(req), std::move(w));
  });
  if (!st.is_ok()) return st;
  admin_listener_ = proto::HostPort{admin_opts.host, admin_server_.port()}.to_string();
  ControlContext admin_control = control_;
  admin_control.server = &admin_server_;
  admin_control.workers = admin_opts.workers;
  admin_routes_ = std::make_unique<ControlRoutes>(admin_control);
  admin_routes_ptr_.store(admin_routes_.get(), std::memory_order_release);
  return Status::ok();
}

// The control loop's handles: the stop and reopen signals and the topology watcher (SIGHUP and
// file changes). Then the control signals are let in: their handlers are in place.
void Server::start_control_loop() {
  loop_ = uv_default_loop();
  sigint_.data = sigterm_.data = sigusr1_.data = this;
  uv_signal_init(loop_, &sigint_);
  uv_signal_init(loop_, &sigterm_);
  uv_signal_init(loop_, &sigusr1_);
  started("the signal handlers", [this] {
    uv_close(reinterpret_cast<uv_handle_t*>(&sigint_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&sigterm_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&sigusr1_), nullptr);
  });
  uv_signal_start(&sigint_, &Server::on_stop_signal, SIGINT);
  uv_signal_start(&sigterm_, &Server::on_stop_signal, SIGTERM);
  uv_signal_start(&sigusr1_, &Server::on_reopen_signal, SIGUSR1);
  watcher_ = std::make_unique<TopologyWatcher>(loop_, topology_);
  started("the topology watcher", [this] { watcher_->close(); });
  if (Status wst = watcher_->start(); !wst.is_ok()) {
    // Still serving; SIGHUP-free operation only loses live reload, which the log says.
    pdr::log::error("topology: live reload disabled: {}", wst.message());
  }
  watcher_->watch_also(watched_files(*topology_.current()));
  pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);  // handlers are in place: let them in
}

// Announce readiness last: once this line is out, every listener, the reload watcher and the
// signal handlers are armed, so a client or a file change that follows it is never missed.
void Server::announce() const {
  std::printf("pdrouter listening http=%s discovery=%s%s%s\n", control_.http_listener.c_str(),
              control_.discovery_listener.c_str(), admin_listener_.empty() ? "" : " admin=",
              admin_listener_.c_str());
  std::fflush(stdout);
  pdr::log::info("pdrouter {} up: http {} ({} workers), admin {}, discovery {}, topology {}", PDR_VERSION,
                 control_.http_listener, server_options_.workers,
                 admin_listener_.empty() ? "on the http listener" : admin_listener_, control_.discovery_listener,
                 topology_.path().empty() ? "defaults" : topology_.path());
}

void Server::run() {
  uv_run(loop_, UV_RUN_DEFAULT);  // until the stop signal's unwind has closed every handle
  uv_loop_close(loop_);
  loop_ = nullptr;
  pdr::log::info("pdrouter stopped");
}

void Server::on_reload(const config::Topology& old_t, const config::Topology& new_t) {
  for (const auto& change : config::restart_required_changes(old_t, new_t)) {
    pdr::log::warn("topology: {} takes effect only after a restart", change);
  }
  config::Topology effective = new_t;
  (void)apply_overrides(flags_, &effective);  // validated at start-up
  discovery_.apply_topology(effective);
  // A reload (SIGHUP) also reopens the access log; a changed key file path is watched.
  access_log_.configure(new_t.access_log.path, new_t.access_log.max_queued_lines);
  access_log_.reopen();
  if (watcher_) watcher_->watch_also(watched_files(new_t));
  tls_.reload(new_t);  // renewed certificates: new handshakes use them
  pdr::log::info("topology reloaded from {} ({} static instances)", topology_.path(), new_t.static_instances.size());
}

void Server::on_stop_signal(uv_signal_t* handle, int signum) {
  auto* s = static_cast<Server*>(handle->data);
  if (s->stopping_) return;
  s->stopping_ = true;
  const auto drain = s->topology_.current()->timeouts.drain;
  pdr::log::info("{} received: draining for up to {} ms, then stopping", signum == SIGINT ? "SIGINT" : "SIGTERM",
                 drain.count());
  s->proxy_->begin_shutdown();  // new P/D requests get 503 while in-flight ones finish
  if (s->admin_proxy_) s->admin_proxy_->begin_shutdown();
  s->server_.stop(drain);
  s->admin_server_.stop(std::min(drain, std::chrono::milliseconds(2000)));
  // The rest, last started first: the servers' stages find them stopped, the replicator revokes
  // its lease, the span exporter sends the drained requests' spans, the loop's handles close.
  s->unwind();
}

// logrotate's postrotate (as for nginx): the access log is reopened at its configured path.
void Server::on_reopen_signal(uv_signal_t* handle, int) {
  auto* s = static_cast<Server*>(handle->data);
  pdr::log::info("SIGUSR1: reopening the access log");
  s->access_log_.reopen();
}

}  // namespace pdr::router
