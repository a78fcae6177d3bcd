#include "router/proxy/proxy_service.h"

#include "router/proxy/admission.h"
#include "router/proxy/client_api.h"
#include "router/proxy/engine_metrics.h"
#include "router/proxy/node_endpoints.h"
#include "router/proxy/pass_through.h"
#include "router/proxy/proxy_session.h"
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
  shared_.workers = workers;
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
  const auto& routing = w.topology()->routing;
  if (!routing.pass_through_unknown) return false;
  switch (check_pass_through(request.path, routing.pass_through_paths)) {
    case PassThroughVerdict::kAllowed:
      serve_one_node(w, request, std::move(writer), OneNodeClass::kPassThrough);
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
  if (shared_.counters.reserve_buffered(bytes, worker(worker_index).topology()->limits.max_buffered_bytes)) return true;
  shared_.counters.refuse(Refusal::kMemoryBudget);
  return false;
}

void ProxyService::release(size_t bytes) {
  shared_.counters.buffered_bytes.fetch_sub(static_cast<int64_t>(bytes), std::memory_order_relaxed);
}

void ProxyService::count_pass_through_refused(const http::Request& request) {
  if (worker(request.worker).topology()->routing.pass_through_unknown) shared_.counters.refuse(Refusal::kPassThroughDenied);
}

void ProxyService::profile(const http::Request& request, http::ResponseWriter writer) {
  serve_profile(worker(request.worker), request, std::move(writer));
}

void ProxyService::admit(http::Request& request, http::ResponseWriter& writer) {
  ProxyCounters& counters = shared_.counters;
  if (refuse_while_shutting_down(shared_, writer, request.path)) return;
  if (auto type = request.header("Content-Type"); type && !is_json_content_type(*type)) {
    counters.refuse(Refusal::kBadContentType);
    writer.send(api_error_response(request.path, 415,
                                   "Content-Type must be application/json, got '" + std::string(*type) + "'",
                                   "invalid_request_error", "unsupported_media_type"));
    return;
  }
  WorkerContext& w = worker(request.worker);
  // Both legs' wire copies are charged with the body (admission.h).
  std::optional<AdmissionSlot> slot = take_admission_slot(w, request, 2, writer);
  if (!slot) return;
  AdmittedRequest admitted;
  if (shared_.tracer != nullptr) {  // tracing on: a sampled (or client-traced) request gets its trace
    admitted.trace = shared_.tracer->begin(request, w.topology()->tracing.sampling_ratio, request.head_at);
  }
  admitted.budget_bytes = slot->bytes();
  slot->hand_over();  // the session gives both back when it ends (its budget grows with its answer)
  admitted.arrived_at = request.head_at;
  admitted.authorization = client_authorization(request);  // Anthropic's x-api-key too (client_api.h)
  admitted.path = std::move(request.path);
  admitted.body = std::move(request.body);
  const std::string& affinity_header = w.topology()->policies.affinity_header;
  if (!affinity_header.empty()) {
    admitted.affinity_header_value = std::string(request.header(affinity_header).value_or(std::string_view()));
  }
  if (const auto& mt = w.topology()->multi_turn; mt.enabled && mt.bind_to == config::Topology::MultiTurn::BindTo::kHeader) {
    admitted.bind_header_value = std::string(request.header(mt.bind_header).value_or(std::string_view()));
  }
  ProxySession::start(w, std::move(admitted), std::move(writer));
}

}  // namespace pdr::router::proxy
