#include "router/proxy/proxy_service.h"

#include "http/json_error.h"
#include "router/proxy/engine_metrics.h"
#include "router/proxy/node_endpoints.h"
#include "router/proxy/proxy_session.h"

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
}

ProxyService::~ProxyService() = default;

WorkerContext& ProxyService::worker(uint32_t index) {
  auto& slot = workers_.at(index);
  if (!slot) slot = std::make_unique<WorkerContext>(shared_, index, server_.loop(index));
  return *slot;
}

void ProxyService::worker_stopped(uint32_t index) {
  if (index < health_probes_.size()) health_probes_[index].reset();
  if (index < workers_.size()) workers_[index].reset();
}

void ProxyService::engine_metrics(const http::Request& request, http::ResponseWriter writer) {
  serve_engine_metrics(worker(request.worker), request, std::move(writer));
}

void ProxyService::health_generate(const http::Request& request, http::ResponseWriter writer) {
  auto& slot = health_probes_.at(request.worker);
  if (!slot) slot = std::make_unique<HealthGenerate>();
  slot->serve(worker(request.worker), request, std::move(writer), server_.port());
}

void ProxyService::models(const http::Request& request, http::ResponseWriter writer) {
  serve_models(worker(request.worker), request, std::move(writer));
}

void ProxyService::ready(const http::Request& request, http::ResponseWriter writer) {
  serve_ready(worker(request.worker), std::move(writer));
}

void ProxyService::one_node(http::Request& request, http::ResponseWriter writer, OneNodeClass node_class) {
  serve_one_node(worker(request.worker), request, std::move(writer), node_class);
}

bool ProxyService::pass_through(http::Request& request, http::ResponseWriter& writer) {
  WorkerContext& w = worker(request.worker);
  if (!w.topology()->routing.pass_through_unknown) return false;
  serve_one_node(w, request, std::move(writer), OneNodeClass::kPassThrough);
  return true;
}

void ProxyService::profile(const http::Request& request, http::ResponseWriter writer) {
  serve_profile(worker(request.worker), request, std::move(writer));
}

void ProxyService::admit(http::Request& request, http::ResponseWriter& writer) {
  ProxyCounters& counters = shared_.counters;
  if (shared_.shutting_down.load(std::memory_order_relaxed)) {
    counters.refuse(Refusal::kShuttingDown);
    writer.send(http::error_response(503, "pdrouter is shutting down", "server_error", "shutting_down"));
    return;
  }
  if (auto type = request.header("Content-Type"); type && !is_json_content_type(*type)) {
    counters.refuse(Refusal::kBadContentType);
    writer.send(http::error_response(415, "Content-Type must be application/json, got '" + std::string(*type) + "'",
                                     "invalid_request_error", "unsupported_media_type"));
    return;
  }
  WorkerContext& w = worker(request.worker);
  const auto limit = static_cast<int64_t>(w.topology()->limits.max_concurrent_requests);
  // Orphaned prefill legs (proxy_session.h) still hold a node's work and an fd: they count too.
  const int64_t orphans = counters.orphan_prefills.load(std::memory_order_relaxed);
  // Both admission refusals give the slot back and ask the client to retry in a second.
  auto refuse_for_now = [&](Refusal why, int status, const std::string& message, const char* type,
                            const char* code) {
    counters.in_flight.fetch_sub(1, std::memory_order_relaxed);
    counters.refuse(why);
    http::Response r = http::error_response(status, message, type, code);
    r.headers.push_back({"Retry-After", "1"});
    writer.send(std::move(r));
  };
  if (counters.in_flight.fetch_add(1, std::memory_order_relaxed) + orphans >= limit) {
    refuse_for_now(Refusal::kTooBusy, 429,
                   "too many requests in flight (limits.max_concurrent_requests = " + std::to_string(limit) + ")",
                   "rate_limit_error", "too_many_requests");
    return;
  }
  // The body stays in memory for the whole request (retries render legs from it): it takes its
  // share of limits.max_buffered_bytes, shared by every worker (security review #11, attacks bug 6).
  const uint32_t budget = w.topology()->limits.max_buffered_bytes;
  if (!counters.reserve_buffered(request.body.size(), budget)) {
    refuse_for_now(Refusal::kMemoryBudget, 503,
                   "pdrouter is holding too many request bytes (limits.max_buffered_bytes = " +
                       std::to_string(budget) + ")",
                   "server_error", "memory_budget");
    return;
  }
  AdmittedRequest admitted;
  admitted.budget_bytes = request.body.size();
  admitted.arrived_at = request.head_at;
  admitted.path = std::move(request.path);
  admitted.body = std::move(request.body);
  admitted.authorization = std::string(request.header("Authorization").value_or(std::string_view()));
  const std::string& affinity_header = w.topology()->policies.affinity_header;
  if (!affinity_header.empty()) {
    admitted.affinity_header_value = std::string(request.header(affinity_header).value_or(std::string_view()));
  }
  ProxySession::start(w, std::move(admitted), std::move(writer));
}

}  // namespace pdr::router::proxy
