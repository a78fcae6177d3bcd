#include "router/routing/slo_headers.h"
#include "router/proxy/proxy_service.h"

#include "proto/base/log.h"

#include "router/proxy/access_logging.h"
#include "router/proxy/admission.h"
#include "router/proxy/client_api.h"
#include "router/proxy/engine_metrics.h"
#include "router/proxy/node_endpoints.h"
#include "router/proxy/pass_through.h"
#include "router/proxy/proxy_session.h"
#include "router/routing/session_affinity.h"
#include "router/tracing/tracer.h"

namespace pdr::router::proxy {

namespace {

bool is_json_content_type(std::string_view value) {
  const size_t semicolon = value.find(';');
  std::string_view media = value.substr(0, semicolon);
  while (!media.empty() && (media.back() == ' ' || media.back() == '\t')) media.remove_suffix(1);
  while (!media.empty() && (media.front() == ' ' || media.front() == '\t')) media.remove_prefix(1);
  if (pdr::iequals(media, "application/json")) return true;
  // application/<something>+json (RFC 6839)
  return media.size() > 17 && pdr::iequals(media.substr(0, 12), "application/") &&
         pdr::iequals(media.substr(media.size() - 5), "+json");
}

}  // namespace

ProxyService::ProxyService(const SnapshotCell<discovery::RegistrySnapshot>& registry,
                           const SnapshotCell<config::Topology>& topology, http::Server& server,
                           uint32_t workers)
    : server_(server), workers_(workers), health_probes_(workers) {
  shared_.registry = &registry;
  shared_.topology = &topology;
  shared_.counters.conversations = &shared_.conversations;
  shared_.counters.sessions = &shared_.sessions;
  shared_.workers = workers;
  // A waiter granted a slot or drained is told on its own worker's loop.
  shared_.admission_queue.set_notify([this](std::shared_ptr<AdmissionQueue::Waiter> waiter) {
    const uint32_t index = waiter->worker();
    server_.post(index, [waiter = std::move(waiter)] { waiter->woken(); });
  });
  shared_.slo_gate.set_post([this](uint32_t index, std::function<void()> fn) { server_.post(index, std::move(fn)); });
}

ProxyService::~ProxyService() {
  // Sessions parked for their SLO are held by the gate: end them while their workers exist.
  shared_.slo_gate.drop_all();
}

WorkerContext& ProxyService::worker(uint32_t index) {
  auto& slot = workers_.at(index);
  if (!slot) slot = std::make_unique<WorkerContext>(shared_, index, server_.loop(index));
  return *slot;
}

void ProxyService::worker_stopped(uint32_t index) {
  if (index == 0) load_scrape_.reset();  // before the context whose pool and timers it uses
  if (index < health_probes_.size()) health_probes_[index].reset();
  if (index < workers_.size()) workers_[index].reset();
}

void ProxyService::start_load_scrape() {
  server_.post(0, [this] {
    if (load_scrape_) return;
    load_scrape_ = std::make_unique<EngineLoadScrape>(worker(0));
    load_scrape_->start();
  });
}

void ProxyService::engine_metrics(const http::Request& request, http::ResponseWriter writer) {
  serve_engine_metrics(worker(request.worker), request, std::move(writer));
}

void ProxyService::health_generate(const http::Request& request, http::ResponseWriter writer) {
  auto& slot = health_probes_.at(request.worker);
  if (!slot) slot = std::make_unique<HealthGenerate>();
  slot->serve(worker(request.worker), request, std::move(writer), server_.port());
}

void ProxyService::models(http::Request& request, http::ResponseWriter writer, const clients::ClientIdentity* client) {
  if (client != nullptr && !client->forward_credential) strip_client_credentials(request);
  serve_models(worker(request.worker), request, std::move(writer));
}

void ProxyService::ready(const http::Request& request, http::ResponseWriter writer) {
  serve_ready(worker(request.worker), std::move(writer));
}

void ProxyService::one_node(http::Request& request, http::ResponseWriter writer, OneNodeClass node_class,
                            const clients::ClientIdentity* client) {
  WorkerContext& w = worker(request.worker);
  clients::TenantTicket ticket;
  if (client != nullptr && !refuse_over_in_flight(w, request, *client, writer, &ticket)) return;
  QueuePlace place;
  if (!queue_place(w, request, client, writer, &place)) return;
  if (client != nullptr && !client->forward_credential) strip_client_credentials(request);
  serve_one_node(w, request, std::move(writer), node_class, std::move(ticket),
                 start_record(shared_, request, client != nullptr ? client->name : std::string_view()), std::move(place));
}

bool ProxyService::authenticate(http::Request& request, http::ResponseWriter& writer,
                                clients::ClientIdentity* client) {
  WorkerContext& w = worker(request.worker);
  const clients::GateVerdict verdict = shared_.gate.admit(request, *w.topology(), w.tenants(), client);
  if (verdict.ok) return true;
  if (verdict.status == 401 && w.leg_log().allow(std::chrono::steady_clock::now())) {
    // The path and the peer only: never the credential.
    pdr::log::warn("client key refused for {} {} from {}", request.method,
                   std::string_view(request.path).substr(0, 200), request.peer);
  }
  http::Response r = api_error_response(request.path, verdict.status, verdict.message, verdict.type, verdict.code);
  if (verdict.status == 401) r.headers.push_back({"WWW-Authenticate", "Bearer realm=\"pdrouter\""});
  if (verdict.retry_after > 0) r.headers.push_back({"Retry-After", std::to_string(verdict.retry_after)});
  log_refused(shared_, request, verdict.status == 429 && verdict.code != "auth_throttled" ? client->name : "",
              verdict.status, r.body.size());
  writer.send(std::move(r));
  return false;
}

bool ProxyService::refuse_over_in_flight(WorkerContext& w, const http::Request& request,
                                         const clients::ClientIdentity& client, http::ResponseWriter& writer,
                                         clients::TenantTicket* ticket) {
  if (clients::TenantTicket::acquire(client.tenant, ticket)) return true;
  http::Response r = api_error_response(
      request.path, 429,
      "tenant '" + client.name + "' has too many requests in flight (tenants: max_in_flight = " +
          std::to_string(client.tenant->max_in_flight.load(std::memory_order_relaxed)) + ")",
      "requests", "rate_limit_exceeded");
  r.headers.push_back({"Retry-After", "1"});
  log_refused(w.shared(), request, client.name, 429, r.body.size());
  writer.send(std::move(r));
  return false;
}

bool ProxyService::pass_through(http::Request& request, http::ResponseWriter& writer) {
  WorkerContext& w = worker(request.worker);
  const auto& routing = w.topology()->routing;
  if (!routing.pass_through_unknown) return false;
  // A relayed path is a client endpoint like the others: the key check first, so a client
  // without a key learns nothing of which paths the nodes serve.
  clients::ClientIdentity client;
  if (!authenticate(request, writer, &client)) return true;
  switch (check_pass_through(request.path, routing.pass_through_paths)) {
    case PassThroughVerdict::kAllowed:
      one_node(request, std::move(writer), OneNodeClass::kPassThrough, &client);
      return true;
    case PassThroughVerdict::kNodeAdmin:
      shared_.counters.refuse(Refusal::kPassThroughDenied);
      writer.send(http::error_response(403,
                                       request.path + " is a node operator endpoint: pdrouter does not relay it "
                                                      "(routing.pass_through_unknown relays client endpoints only)",
                                       "invalid_request_error", "forbidden"));
      return true;
    case PassThroughVerdict::kNotListed:
      shared_.counters.refuse(Refusal::kPassThroughDenied);
      writer.send(http::error_response(404, "no route for " + request.method + " " + request.path,
                                       "invalid_request_error", "not_found"));
      return true;
  }
  return false;
}

bool ProxyService::reserve(uint32_t worker_index, size_t bytes) {
  // The limit is the worker's current topology's (a reload applies to the next body).
  if (shared_.counters.buffered.reserve(bytes, worker(worker_index).topology()->limits.max_buffered_bytes)) return true;
  shared_.counters.refuse(Refusal::kMemoryBudget);
  return false;
}

void ProxyService::release(size_t bytes) {
  shared_.counters.buffered.release(static_cast<int64_t>(bytes));
}

void ProxyService::count_pass_through_refused(const http::Request& request) {
  if (worker(request.worker).topology()->routing.pass_through_unknown) shared_.counters.refuse(Refusal::kPassThroughDenied);
}

void ProxyService::profile(const http::Request& request, http::ResponseWriter writer) {
  serve_profile(worker(request.worker), request, std::move(writer));
}

// A P/D request past the checks of admit(): its session starts once it has a slot.
struct ProxyService::PdAdmission {
  ProxyService* service;
  WorkerContext* w;
  clients::TenantTicket ticket;
  std::string tenant;  // "" without a gate (tests)
  bool forward_authorization = true;
  RequestSlo slo;

  void admitted(http::Request& request, http::ResponseWriter writer, AdmissionSlot slot, const QueueWait& wait) {
    service->start_session(*w, request, std::move(writer), std::move(slot), wait, *this);
  }
  void refused(const http::Request& request, const Answered& answered) {
    if (answered.status == 0) {  // its client went away while it waited
      log_answered(service->shared_, start_record(service->shared_, request, tenant), request.head_at, 0, "cancelled", 0);
    } else {
      log_refused(service->shared_, request, tenant, answered.status, answered.bytes);
    }
  }
};

void ProxyService::admit(http::Request& request, http::ResponseWriter& writer, const clients::ClientIdentity* client) {
  ProxyCounters& counters = shared_.counters;
  const std::string_view tenant = client != nullptr ? std::string_view(client->name) : std::string_view();
  Answered refused;
  if (refuse_while_shutting_down(shared_, writer, request.path, &refused)) {
    log_refused(shared_, request, tenant, refused.status, refused.bytes);
    return;
  }
  if (auto type = request.header("Content-Type"); type && !is_json_content_type(*type)) {
    counters.refuse(Refusal::kBadContentType);
    http::Response r = api_error_response(request.path, 415,
                                          "Content-Type must be application/json, got '" + std::string(*type) + "'",
                                          "invalid_request_error", "unsupported_media_type");
    log_refused(shared_, request, tenant, r.status, r.body.size());
    writer.send(std::move(r));
    return;
  }
  WorkerContext& w = worker(request.worker);
  PdAdmission then{this, &w};
  // SLOs mean something only to a predicting policy; with the others the headers are not read.
  const config::Topology::Policies& policies = w.topology()->policies;
  const bool predicts = policies.prefill == config::PolicyName::kPredictedLatency ||
                        policies.decode == config::PolicyName::kPredictedLatency;
  if (Status st = predicts ? request_slo(request, policies.predicted_latency, &then.slo) : Status::ok(); !st.is_ok()) {
    counters.refuse(Refusal::kBadSlo);
    http::Response r = api_error_response(request.path, 400, st.message(), "invalid_request_error", "bad_slo");
    log_refused(shared_, request, tenant, r.status, r.body.size());
    writer.send(std::move(r));
    return;
  }
  if (client != nullptr && !refuse_over_in_flight(w, request, *client, writer, &then.ticket)) return;
  QueuePlace place;
  if (!queue_place(w, request, client, writer, &place)) return;
  if (client != nullptr) {
    then.forward_authorization = client->forward_credential;
    then.tenant = client->name;
  }
  // Both legs' wire copies are charged with the body (admission.h).
  admit_or_queue(w, request, writer, 2, std::move(place), std::move(then));
}


void ProxyService::start_session(WorkerContext& w, http::Request& request, http::ResponseWriter writer,
                                 AdmissionSlot slot, const QueueWait& wait, PdAdmission& then) {
  AdmittedRequest admitted;
  admitted.ticket = std::move(then.ticket);
  if (shared_.tracer != nullptr) {  // tracing on: a sampled (or client-traced) request gets its trace
    admitted.trace = shared_.tracer->begin(request, w.topology()->tracing.sampling_ratio, request.head_at);
    if (admitted.trace && wait.waited()) admitted.trace->queue_wait(wait.start, wait.end);
  }
  admitted.budget_bytes = slot.bytes();
  slot.hand_over();  // the session gives both back when it ends (its budget grows with its answer)
  admitted.arrived_at = request.head_at;
  admitted.authorization = client_authorization(request);  // Anthropic's x-api-key too (client_api.h)
  admitted.forward_authorization = then.forward_authorization;
  admitted.tenant = std::move(then.tenant);
  admitted.slo = then.slo;
  admitted.log_record = start_record(shared_, request, admitted.tenant);
  if (admitted.log_record && wait.waited()) {
    admitted.log_record->queue_ms = std::chrono::duration<double, std::milli>(wait.end - wait.start).count();
  }
  admitted.path = std::move(request.path);
  admitted.body = std::move(request.body);
  const std::string& affinity_header = w.topology()->policies.affinity_header;
  if (!affinity_header.empty()) {
    admitted.affinity_header_value = std::string(request.header(affinity_header).value_or(std::string_view()));
  }
  if (const auto& sa = w.topology()->session_affinity; sa.enabled) {
    if (auto value = first_session_header(sa, [&](std::string_view name) { return request.header(name); })) {
      admitted.session_header_value = std::string(*value);
    }
  }
  if (const auto& mt = w.topology()->multi_turn;
      (mt.enabled || w.topology()->session_affinity.enabled) && mt.bind_to == config::Topology::MultiTurn::BindTo::kHeader) {
    admitted.bind_header_value = std::string(request.header(mt.bind_header).value_or(std::string_view()));
  }
  ProxySession::start(w, std::move(admitted), std::move(writer));
}

bool ProxyService::queue_place(WorkerContext& w, const http::Request& request, const clients::ClientIdentity* client,
                               http::ResponseWriter& writer, QueuePlace* place) {
  const uint32_t tenant_priority =
      client != nullptr && client->tenant ? client->tenant->priority.load(std::memory_order_relaxed) : kDefaultPriority;
  // With client keys the tenant is proven and its class a ceiling; without, the tenant is only
  // what the client says, and so may be its class.
  const bool header_sets_any = !w.topology()->client_auth.enabled();
  if (queue_priority(request.header(kPriorityHeader), tenant_priority, header_sets_any, &place->priority)) {
    if (client != nullptr) place->tenant = client->name;
    return true;
  }
  shared_.counters.refuse(Refusal::kBadParameter);
  http::Response r = api_error_response(
      request.path, 400,
      std::string(kPriorityHeader) + " must be an integer from 0 (served last) to " +
          std::to_string(kPriorityClasses - 1) + " (served first)",
      "invalid_request_error", "bad_priority");
  log_refused(shared_, request, client != nullptr ? std::string_view(client->name) : std::string_view(), r.status,
              r.body.size());
  writer.send(std::move(r));
  return false;
}

}  // namespace pdr::router::proxy
