// ProxyService: the router's client-facing API on every HTTP worker.
//   POST /v1/completions, POST /v1/chat/completions   P/D requests (proxy_session.h), and so are
//   /inference/v1/generate, /v1/responses and /v1/messages (Anthropic's: its errors and
//   credential as client_api.h says)
//   GET  /v1/models                                   a decode's model list, cached briefly
//   GET  /ready                                       200 only when a compatible pair exists
//   POST /start_profile, POST /stop_profile           fanned out to every up instance
//   render, tokenize, pooling endpoints (and unknown paths with routing.pass_through_unknown)
//                                                     relayed to one node (one_node_relay.h)
// Admission for P/D requests, in order: 405 (not POST; answered by the route table), 503 (shutting down), 415 (a
// Content-Type that is not JSON: application/json or application/*+json), 400 bad_priority (an
// x-pdr-priority that is no class), then with limits.max_concurrent_requests requests already in
// flight (P/D and one-node together, across all workers) a wait in the admission queue (429 when
// it is full or off, 503 queue_timeout), 503 memory_budget (limits.max_buffered_bytes). The one-node endpoints take the
// same 503/429/503 (admission.h, one_node_relay.h). A request without Content-Type is read as JSON. Body-size
// (413) and header limits are enforced earlier by the HTTP server.
// Before all of it, every client endpoint but /health and /ready passes authenticate() (the route
// table's Guard::kClientKey): the client key and the tenant's request rate (router/clients/
// client_gate.h); the P/D and one-node endpoints then take an in-flight slot of the tenant
// (429 over its max_in_flight), and a P/D request reserves the tenant's tokens when the session
// has parsed it (tenant_tokens.h). Without client_auth.keys_file and tenant limits all of that
// admits everything. With the access log on, every request of these endpoints leaves one line
// (access_logging.h).
//
// Threads: handle() runs on every worker concurrently; per-worker state is created on the worker
// at its first request and released by worker_stopped() on the same thread (wire it to
// ServerOptions::on_worker_stop).
#pragma once

#include <memory>
#include <vector>

#include "router/http/http_server.h"
#include "router/proxy/admission.h"
#include "router/proxy/engine_load_scrape.h"
#include "router/proxy/health_generate.h"
#include "router/proxy/one_node_relay.h"
#include "router/proxy/proxy_shared.h"

namespace pdr::router::proxy {

// Also the client server's body budget (router/http/body_budget.h, ServerOptions::body_budget): bodies
// are charged to limits.max_buffered_bytes as the server buffers them, refusals counted as
// pdrouter_requests_refused_total{reason="memory_budget"}; admission (admission.h) takes the
// charge over. Only for the server whose workers this service's worker contexts belong to.
class ProxyService : public http::BodyBudget {
 public:
  // `server` provides each worker's loop; `workers` is its worker count.
  ProxyService(const SnapshotCell<discovery::RegistrySnapshot>& registry,
               const SnapshotCell<config::Topology>& topology, http::Server& server,
               uint32_t workers);
  ~ProxyService() override;

  // http::BodyBudget: on worker `worker`'s thread / any thread.
  bool reserve(uint32_t worker, size_t bytes) override;
  void release(size_t bytes) override;

  // The endpoints, one per route (router/route_table.cc decides which request reaches which,
  // and answers 404/405 itself). Each runs on worker request.worker.
  // `client`: what authenticate() said of the request (null: no gate ran, as in tests).
  void admit(http::Request& request, http::ResponseWriter& writer,
             const clients::ClientIdentity* client = nullptr);  // POST of the P/D paths
  void models(http::Request& request, http::ResponseWriter writer, const clients::ClientIdentity* client = nullptr);
  void ready(const http::Request& request, http::ResponseWriter writer);
  void profile(const http::Request& request, http::ResponseWriter writer);  // both profile paths
  // GET /engine_metrics (engine_metrics.h) and GET /health_generate (health_generate.h; on the
  // client listener only: the probe goes to this service's own port).
  void engine_metrics(const http::Request& request, http::ResponseWriter writer);
  void health_generate(const http::Request& request, http::ResponseWriter writer);
  // The one-node endpoints (render, tokenize, pooling, pass-through): one_node_relay.h.
  void one_node(http::Request& request, http::ResponseWriter writer, OneNodeClass node_class,
                const clients::ClientIdentity* client = nullptr);
  // The client key check and the tenant's request rate (router/clients/client_gate.h): true with
  // *client filled, else answered (401, 429; in the path's error shape), counted and logged.
  bool authenticate(http::Request& request, http::ResponseWriter& writer, clients::ClientIdentity* client);
  // A path no route names: with routing.pass_through_unknown, relayed to one decode or refused
  // (pass_through.h: 403 for a node admin path, 404 for one routing.pass_through_paths does not
  // name; counted as pdrouter_requests_refused_total{reason="pass_through_denied"}); takes the
  // writer and returns true. Off: returns false and leaves the writer (the caller answers 404).
  bool pass_through(http::Request& request, http::ResponseWriter& writer);
  // Counts a P/D path asked with a wrong method (the route table answers the 405).
  void count_wrong_method() { shared_.counters.refuse(Refusal::kBadPath); }
  // Counts a refusal the route table answered itself (a request path it could not normalise).
  void count_refusal(Refusal why) { shared_.counters.refuse(why); }
  // A path of the other listener, asked where pass-through could have relayed it: counted as a
  // refused pass-through while routing.pass_through_unknown is on (the route table answers 404).
  void count_pass_through_refused(const http::Request& request);

  // What cache-aware routing consults (proxy_shared.h); both outlive the service. Call before
  // the first request.
  void use_cache(const cache::BlockIndex* block_index, cache::PrefixTree* prefix_tree) {
    shared_.block_index = block_index;
    shared_.prefix_tree = prefix_tree;
  }

  // Where each client request's line goes (router/clients/access_log.h); outlives the service.
  // Call before the first request.
  void use_access_log(clients::AccessLog* log) { shared_.access_log = log; }
  const clients::ClientGate& gate() const { return shared_.gate; }

  // Refuse new P/D requests from now on (the drain on shutdown); /ready turns 503. Requests
  // waiting in the admission queue get their 503 now.
  void begin_shutdown() {
    shared_.shutting_down.store(true);
    shared_.admission_queue.shut_down();
    shared_.slo_gate.wake();  // requests waiting for their SLO: answered 503 shutting_down
  }
  // TLS to nodes and to pdrouter's own listener (router/tls_contexts.h); thread-safe.
  void set_tls(std::shared_ptr<const NodeTlsContexts> nodes, std::shared_ptr<const http::TlsClientContext> self) {
    shared_.node_tls.publish(std::move(nodes));
    shared_.self_tls.publish(std::move(self));
  }
  // Tracing (router/tracing/tracer.h); set before the server starts, outlives it. Null: off.
  void use_tracer(tracing::Tracer* tracer) { shared_.tracer = tracer; }
  void worker_stopped(uint32_t worker);
  // Starts the periodic load scrape (engine_load_scrape.h) on worker 0's loop; it reads
  // load_signals at every tick, so it runs (idle while off) until worker 0 stops. Call once,
  // after the server started.
  void start_load_scrape();

  const ProxyCounters& counters() const { return shared_.counters; }
  const routing::RouteDecisionLog& route_decisions() const { return shared_.route_decisions; }
  // The multi-turn entries every worker shares (registry.backend etcd mirrors them).
  ConversationCache& conversations() { return shared_.conversations; }
  // The session affinity bindings and their counters (registry.backend etcd mirrors them).
  SessionTable& sessions() { return shared_.sessions; }
  SessionAffinityCounters& session_counters() { return shared_.counters.session_affinity; }
  // listeners.admin: this service's profile fan-outs are counted in `other`'s counters.
  void count_profiles_in(ProxyService& other) { shared_.profile_fanouts = &other.shared_.counters.profile_fanouts; }

 private:
  WorkerContext& worker(uint32_t index);
  struct PdAdmission;
  // A P/D request with its slot: its session starts.
  void start_session(WorkerContext& w, http::Request& request, http::ResponseWriter writer, AdmissionSlot slot,
                     const QueueWait& wait, PdAdmission& then);
  // The request's class (x-pdr-priority under its tenant's) and tenant in the admission queue:
  // true, else answered 400 (counted as bad_parameter) and logged.
  bool queue_place(WorkerContext& w, const http::Request& request, const clients::ClientIdentity* client,
                   http::ResponseWriter& writer, QueuePlace* place);
  // The tenant's max_in_flight: true with *ticket holding a slot, else answered 429 and logged.
  bool refuse_over_in_flight(WorkerContext& w, const http::Request& request, const clients::ClientIdentity& client,
                             http::ResponseWriter& writer, clients::TenantTicket* ticket);

  ProxyShared shared_;
  http::Server& server_;
  std::vector<std::unique_ptr<WorkerContext>> workers_;  // [i] touched only by worker i
  std::vector<std::unique_ptr<HealthGenerate>> health_probes_;  // [i] touched only by worker i
  std::unique_ptr<EngineLoadScrape> load_scrape_;  // touched only by worker 0
};

}  // namespace pdr::router::proxy
