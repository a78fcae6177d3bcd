// POST /abort_requests to tokens-only nodes; contract in abort_requests.h.
#include "router/proxy/abort_requests.h"

#include <utility>

#include "proto/generate_request.h"
#include "proto/json_splice.h"
#include "router/proxy/one_node_relay.h"

namespace pdr::router::proxy {

std::string generate_engine_request_id(std::string_view request_id) {
  return "generate-tokens-" + std::string(request_id);
}

std::string abort_requests_body(std::string_view request_id) {
  return "{\"request_ids\":[" + proto::json_string(generate_engine_request_id(request_id)) + "]}";
}

bool abort_leg_on_node(WorkerContext& worker, const discovery::Instance& node, std::string_view path,
                       std::string_view request_id) {
  if (path != proto::kGeneratePath || request_id.empty() || !serves_capability(node.labels, kServesTokensOnly)) {
    return false;
  }
  const auto& topology = worker.topology();
  http::UpstreamRequest request;
  request.method = "POST";
  request.path = "/abort_requests";
  request.headers.push_back({"Content-Type", "application/json"});
  if (!topology->connectors.upstream_api_key.empty()) {
    request.headers.push_back({"Authorization", "Bearer " + topology->connectors.upstream_api_key});
  }
  request.body = abort_requests_body(request_id);
  request.only_content_type = true;
  ProxyCounters& counters = worker.counters();
  auto status = std::make_shared<int>(0);
  http::UpstreamCallbacks cb;
  cb.on_head = [status](int code, const std::vector<http::Header>&) { *status = code; };
  cb.on_body = [](std::string_view) {};
  cb.on_complete = [&counters, status] {
    ProxyCounters::bump(counters.abort_requests[*status >= 200 && *status < 300 ? 0 : 1]);
  };
  cb.on_error = [&counters](const Status&) { ProxyCounters::bump(counters.abort_requests[1]); };
  cb.keep_alive = status;
  const http::UpstreamTimeouts timeouts{topology->timeouts.connect, topology->timeouts.connect,
                                        topology->timeouts.connect};
  // The handle is not kept: the pool holds the call until it ends, and nobody cancels it.
  (void)worker.upstream().start(node.http_address, std::move(request), timeouts, std::move(cb));
  return true;
}

}  // namespace pdr::router::proxy
