// Server: the pdrouter process's parts and their lifetime. router/main.cc parses the command line
// and maps the outcome of start() to an exit code; everything the process runs lives here.
//
// start() loads the topology, applies the command line's overrides, checks what only the
// combination can get wrong, then starts the parts in this order:
//   discovery service -> KV events subscriber -> etcd registry replicator -> Kubernetes pod watcher
//   -> span exporter (tracing) -> access log + proxy services -> HTTP server -> admin server
//   -> signal handlers + topology watcher (the control loop's handles)
// Each part is put on a list of started stages as its start is attempted (every stop is
// idempotent and harmless on a part that did not start). A start-up failure returns at once and
// the destructor stops what is on the list, last first: whatever stage failed, exactly what was
// started is stopped, and every thread is joined before any part is freed. A stop signal drains
// the HTTP servers, then unwinds the same list; run() returns once the loop's handles are closed.
//
// Members are declared so that, after the list is unwound, destruction also respects who uses
// whom (a part is declared after what it uses, so it goes first): the proxy services after the
// access log their sessions write to and before the HTTP servers whose workers call them, the
// replicator and the pod watcher after the discovery service they post to.
//
// Signals: SIGINT and SIGTERM drain (timeouts.drain_ms) and stop; SIGHUP (through the topology
// watcher) reloads the topology and the client key file and reopens the access log; SIGUSR1
// reopens the access log. Those four are blocked from the first thread start until the loop's
// handlers are in place, so they always reach the control loop's thread, never a worker's.
//
// Threads: construct, start(), run() and destroy on one thread (the control loop's).
#pragma once

#include <uv.h>

#include <atomic>
#include <csignal>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proto/base/snapshot_cell.h"
#include "discovery/config/topology_store.h"
#include "discovery/discovery_service.h"
#include "router/http/http_server.h"
#include "router/cache/block_index.h"
#include "router/cache/kv_events_subscriber.h"
#include "router/cache/prefix_tree.h"
#include "router/clients/access_log.h"
#include "router/control_routes.h"
#include "discovery/sources/etcd/registry_replicator.h"
#include "discovery/sources/kubernetes/pod_watcher.h"
#include "router/proxy/proxy_service.h"
#include "router/tls_contexts.h"
#include "router/topology_watcher.h"
#include "router/tracing/span_exporter.h"
#include "router/tracing/tracer.h"

namespace pdr::router {

// What the command line overrides in the topology file (router/main.cc parses it).
struct ServerFlags {
  std::string config_path;  // "" = the built-in defaults
  std::string http;         // overrides listeners.http
  std::string discovery;    // overrides listeners.discovery
  uint32_t workers = 0;     // overrides workers when workers_set
  bool workers_set = false;
};

class Server {
 public:
  enum class StartResult {
    kStarted,
    kBadConfiguration,  // the topology, the flags or a file they name: said on stderr
    kFailed,            // a part could not start (a port in use, ...): logged as critical
  };

  explicit Server(ServerFlags flags);
  ~Server();  // unwinds the started stages, last first, then frees the parts
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Call once. On kStarted every listener, the reload watcher and the signal handlers are armed
  // and the "pdrouter listening ..." line is on stdout.
  StartResult start();
  // After kStarted: serves until a stop signal has drained and stopped everything.
  void run();

 private:
  struct Stage {
    const char* name;  // what it stops (for a reader or a debugger; not logged)
    std::function<void()> stop;
  };

  StartResult check_configuration(config::Topology* topology);
  void block_control_signals();
  Status start_discovery(const config::Topology& topology);
  Status start_kv_events(const config::Topology& topology);
  Status start_replicator(const config::Topology& topology);
  Status start_pod_watcher(const config::Topology& topology);
  void start_tracing(const config::Topology& topology);
  void make_proxy(const config::Topology& topology);
  void fill_control_context(const config::Topology& topology);
  Status start_http(const config::Topology& topology);
  Status start_admin(const config::Topology& topology);
  void start_control_loop();
  void announce() const;

  // Puts a part on the list before its start is attempted.
  void started(const char* name, std::function<void()> stop);
  // Stops the listed parts, last first, emptying the list. Idempotent.
  void unwind();
  void on_reload(const config::Topology& old_t, const config::Topology& new_t);
  static void on_stop_signal(uv_signal_t* handle, int signum);
  static void on_reopen_signal(uv_signal_t* handle, int signum);

  const ServerFlags flags_;
  config::TopologyStore topology_;
  SnapshotCell<discovery::RegistrySnapshot> registry_;
  discovery::DiscoveryCounters discovery_counters_;
  discovery::DiscoveryService discovery_{registry_, discovery_counters_};
  // kv_events.enabled only; declared before the servers so it outlives their workers.
  std::unique_ptr<cache::BlockIndex> block_index_;
  std::unique_ptr<cache::KvEventsSubscriber> kv_events_;
  // Where pdrouter routed earlier text prompts (cache_aware); made at start, empty until used.
  std::unique_ptr<cache::PrefixTree> prefix_tree_;
  // TLS contexts of the listeners and of the legs to nodes, remade on reload.
  TlsContexts tls_;
  // tracing.endpoint set only; declared before the servers so it outlives their workers.
  std::unique_ptr<tracing::SpanExporter> span_exporter_;
  std::unique_ptr<tracing::Tracer> tracer_;
  // registry.backend: etcd only; destroyed before the discovery service it posts to.
  std::unique_ptr<discovery::sources::etcd::RegistryReplicator> replicator_;
  // kubernetes.enabled only; destroyed before the discovery service it posts to.
  std::unique_ptr<discovery::sources::kubernetes::PodWatcher> pod_watcher_;
  // Client request lines (access_log.path); before the proxy services, whose sessions log to it.
  clients::AccessLog access_log_;
  // The listeners' routes, read by their handlers: they show the bound ports, known only after
  // each server's start(), so they are published just after it (null until then: 503).
  std::atomic<const ControlRoutes*> routes_ptr_{nullptr};
  std::atomic<const ControlRoutes*> admin_routes_ptr_{nullptr};
  // Declared before the server so it outlives the worker threads (their on_worker_stop uses it).
  std::unique_ptr<proxy::ProxyService> proxy_;
  http::Server server_;
  // The operator listener (listeners.admin), when configured; the same ordering rule.
  std::unique_ptr<proxy::ProxyService> admin_proxy_;
  http::Server admin_server_;
  ControlContext control_;  // the client listener's; the admin listener's is a copy
  std::unique_ptr<ControlRoutes> routes_;
  std::unique_ptr<ControlRoutes> admin_routes_;
  http::ServerOptions server_options_;  // the client listener's, as started
  std::string admin_listener_;          // bound, "" without listeners.admin
  // The control loop: its handles are closed by the unwind; the loop itself is closed by run()
  // or, when start() failed past its making, by the destructor.
  uv_loop_t* loop_ = nullptr;
  uv_signal_t sigint_{}, sigterm_{}, sigusr1_{};
  std::unique_ptr<TopologyWatcher> watcher_;
  sigset_t previous_mask_{};
  bool stopping_ = false;
  std::vector<Stage> stages_;  // started parts, in start order
};

}  // namespace pdr::router
