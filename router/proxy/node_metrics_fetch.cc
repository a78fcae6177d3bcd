#include "router/proxy/node_metrics_fetch.h"

#include <utility>

#include "router/proxy/proxy_shared.h"

namespace pdr::router::proxy {

namespace {

// Shared by the call's callbacks; holds the call so that on_body can cancel it.
struct Fetch {
  NodeMetricsAnswer answer;
  size_t max_bytes = 0;
  std::weak_ptr<http::UpstreamCall> call;
  std::function<void(NodeMetricsAnswer&&)> done;

  void finish() {
    if (!done) return;
    auto fn = std::move(done);
    done = nullptr;
    fn(std::move(answer));
  }
};

}  // namespace

std::shared_ptr<http::UpstreamCall> fetch_node_metrics(WorkerContext& worker, const discovery::Instance& node,
                                                       const http::UpstreamTimeouts& timeouts, size_t max_bytes,
                                                       std::function<void(NodeMetricsAnswer&&)> done) {
  auto fetch = std::make_shared<Fetch>();
  fetch->max_bytes = max_bytes;
  fetch->done = std::move(done);
  http::UpstreamRequest upstream;
  upstream.method = "GET";
  upstream.path = "/metrics";
  const auto& topology = worker.topology();
  if (!topology->connectors.upstream_api_key.empty()) {
    upstream.headers.push_back({"Authorization", "Bearer " + topology->connectors.upstream_api_key});
  }
  upstream.tls = worker.node_tls(node.http_address);
  http::UpstreamCallbacks cb;
  cb.on_head = [fetch](int status, const std::vector<http::Header>&) { fetch->answer.status = status; };
  cb.on_body = [fetch](std::string_view chunk) {
    NodeMetricsAnswer& a = fetch->answer;
    if (a.status != 200) return;  // an error page is not read
    if (a.body.size() + chunk.size() > fetch->max_bytes) {
      // Abandoned at once rather than read to its end: a node must not make pdrouter read (or
      // hold) more than the limit.
      a.result = NodeMetricsAnswer::Result::kTooLarge;
      a.body.clear();
      a.body.shrink_to_fit();
      if (auto call = fetch->call.lock()) call->cancel();
      fetch->finish();
      return;
    }
    a.body.append(chunk);
  };
  cb.on_complete = [fetch] {
    NodeMetricsAnswer& a = fetch->answer;
    a.result = a.status == 200 ? NodeMetricsAnswer::Result::kOk : NodeMetricsAnswer::Result::kStatus;
    if (a.status != 200) a.body.clear();
    fetch->finish();
  };
  cb.on_error = [fetch](const Status&) {
    NodeMetricsAnswer& a = fetch->answer;
    if (auto call = fetch->call.lock()) a.failure = call->failure();
    a.result = NodeMetricsAnswer::Result::kError;
    a.body.clear();
    fetch->finish();
  };
  std::shared_ptr<http::UpstreamCall> call =
      worker.pool().start(node.http_address, std::move(upstream), timeouts, std::move(cb));
  fetch->call = call;
  return call;
}

}  // namespace pdr::router::proxy
