#include "router/proxy/node_endpoints.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "proto/json_splice.h"
#include "router/http/json_error.h"
#include "router/routing/pairing.h"

namespace pdr::router::proxy {

namespace {

constexpr size_t kMaxModelsAnswer = 1024 * 1024;
constexpr size_t kMaxProfileAnswer = 64 * 1024;

http::UpstreamTimeouts control_timeouts(const config::Topology& t) {
  return {t.timeouts.connect, t.timeouts.first_byte, t.timeouts.stream_idle};
}

std::vector<http::Header> auth_headers(const config::Topology& t, const http::Request& request) {
  std::vector<http::Header> out;
  std::string auth = upstream_authorization(t, request.header("Authorization").value_or(std::string_view()));
  if (!auth.empty()) out.push_back({"Authorization", std::move(auth)});
  return out;
}

}  // namespace

void serve_models(WorkerContext& worker, const http::Request& request, http::ResponseWriter writer) {
  ModelsCache& cache = worker.models();
  const auto now = std::chrono::steady_clock::now();
  if (!cache.body.empty() && now - cache.fetched_at < ModelsCache::kTtl) {
    worker.counters().bump(worker.counters().models.cache_hits);
    writer.send(http::Response::json(200, cache.body));
    return;
  }
  const auto& snapshot = worker.registry();
  std::vector<InstancePtr> decodes;
  for (const auto& inst : snapshot->instances) {
    if (inst->role == proto::Role::kDecode && routable(*inst)) decodes.push_back(inst);
  }
  if (decodes.empty()) {
    writer.send(http::error_response(503, "no decode instance is up to list models", "server_error", "no_pair"));
    return;
  }
  const InstancePtr decode = decodes[worker.random() % decodes.size()];
  const auto& topology = worker.topology();
  http::UpstreamRequest upstream;
  upstream.method = "GET";
  upstream.path = "/v1/models";
  upstream.headers = auth_headers(*topology, request);

  struct Fetch {
    http::ResponseWriter writer;
    int status = 0;
    std::string body;
    bool too_large = false;
  };
  auto fetch = std::make_shared<Fetch>();
  fetch->writer = std::move(writer);
  worker.counters().bump(worker.counters().models.fetches);
  http::UpstreamCallbacks cb;
  cb.on_head = [fetch](int status, const std::vector<http::Header>&) { fetch->status = status; };
  cb.on_body = [fetch](std::string_view chunk) {
    if (fetch->body.size() + chunk.size() > kMaxModelsAnswer) {
      fetch->too_large = true;
      return;
    }
    fetch->body.append(chunk);
  };
  WorkerContext* w = &worker;
  const std::string key = decode->key;
  cb.on_complete = [fetch, w, key] {
    if (fetch->too_large) {
      fetch->writer.send(http::error_response(502, "decode " + key + " /v1/models answer too large", "server_error",
                                              "upstream_failed"));
      return;
    }
    if (fetch->status == 200) {
      w->models().body = fetch->body;
      w->models().fetched_at = std::chrono::steady_clock::now();
    }
    // Any other status (e.g. 401 from a node with an API key) is the node's answer, relayed.
    fetch->writer.send(http::Response::json(fetch->status, std::move(fetch->body)));
  };
  cb.on_error = [fetch, key](const Status& error) {
    fetch->writer.send(http::error_response(502, "decode " + key + " /v1/models: " + error.message(), "server_error",
                                            "upstream_failed"));
  };
  upstream.tls = worker.node_tls(decode->http_address);
  auto call = worker.pool().start(decode->http_address, std::move(upstream), control_timeouts(*topology), std::move(cb));
  // A client that leaves closes the call too.
  std::weak_ptr<http::UpstreamCall> weak = call;
  fetch->writer.on_client_close([weak] {
    if (auto c = weak.lock()) c->cancel();
  });
}

void serve_ready(WorkerContext& worker, http::ResponseWriter writer) {
  if (worker.shared().shutting_down.load(std::memory_order_relaxed)) {
    writer.send(http::error_response(503, "pdrouter is shutting down", "server_error", "shutting_down"));
    return;
  }
  const auto& snapshot = worker.registry();
  Status st = any_pair(*snapshot);
  if (!st.is_ok()) {
    writer.send(http::error_response(503, "not ready: " + st.message(), "server_error", "no_pair"));
    return;
  }
  proto::JsonObjectWriter body;
  body.string("status", "ready")
      .integer("prefill", static_cast<int64_t>(snapshot->count(proto::Role::kPrefill, discovery::InstanceState::kUp)))
      .integer("decode", static_cast<int64_t>(snapshot->count(proto::Role::kDecode, discovery::InstanceState::kUp)));
  writer.send(http::Response::json(200, body.finish()));
}

void serve_profile(WorkerContext& worker, const http::Request& request, http::ResponseWriter writer) {
  const auto& snapshot = worker.registry();
  std::vector<InstancePtr> targets;
  for (const auto& inst : snapshot->instances) {
    if (routable(*inst)) targets.push_back(inst);
  }
  if (targets.empty()) {
    writer.send(http::error_response(503, "no instance is up to profile", "server_error", "no_pair"));
    return;
  }
  ProxyCounters::bump(worker.shared().profile_fanouts != nullptr ? *worker.shared().profile_fanouts
                                                                 : worker.counters().profile_fanouts);
  struct Result {
    std::string instance, role, error;
    int status = 0;
  };
  struct FanOut {
    http::ResponseWriter writer;
    std::vector<Result> results;
    std::vector<std::shared_ptr<http::UpstreamCall>> calls;
    size_t pending = 0;
    void answer() {
      bool all_ok = true;
      std::string list = "[";
      for (size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        all_ok = all_ok && r.status >= 200 && r.status < 300;
        proto::JsonObjectWriter item;
        item.string("instance", r.instance).string("role", r.role);
        if (r.status) item.integer("status", r.status); else item.null("status");
        if (r.error.empty()) item.null("error"); else item.string("error", r.error);
        if (i) list += ",";
        list += item.finish();
      }
      list += "]";
      writer.send(http::Response::json(all_ok ? 200 : 502, proto::JsonObjectWriter().raw("results", list).finish()));
    }
  };
  auto fan = std::make_shared<FanOut>();
  fan->writer = std::move(writer);
  fan->results.resize(targets.size());
  fan->pending = targets.size();
  const auto& topology = worker.topology();
  for (size_t i = 0; i < targets.size(); ++i) {
    fan->results[i].instance = targets[i]->key;
    fan->results[i].role = std::string(proto::to_string(targets[i]->role));
    http::UpstreamRequest upstream;
    upstream.method = "POST";
    upstream.path = request.path;
    // The caller authenticated with the admin key (main.cc admits these paths through
    // AdminRoutes::admit_profile), so the router's own upstream key may go with the call. The
    // client's Authorization never does: it may be the admin key itself.
    if (!topology->connectors.upstream_api_key.empty()) {
      upstream.headers.push_back({"Authorization", "Bearer " + topology->connectors.upstream_api_key});
    }
    // vLLM's profile endpoints take no body; a small one is forwarded (as vLLM's proxies do), a
    // large one never is (admit_profile refused it with 413 already; this is the backstop).
    if (request.body.size() <= kMaxProfileBodyBytes) {
      upstream.body = request.body;
      if (auto type = request.header("Content-Type")) upstream.headers.push_back({"Content-Type", std::string(*type)});
    }
    http::UpstreamCallbacks cb;
    cb.on_head = [fan, i](int status, const std::vector<http::Header>&) { fan->results[i].status = status; };
    cb.on_body = [fan, i](std::string_view chunk) {
      Result& r = fan->results[i];
      if (r.status >= 300 && r.error.size() + chunk.size() <= kMaxProfileAnswer) r.error.append(chunk);
    };
    cb.on_complete = [fan] {
      if (--fan->pending == 0) fan->answer();
    };
    cb.on_error = [fan, i](const Status& error) {
      fan->results[i].status = 0;
      fan->results[i].error = error.message();
      if (--fan->pending == 0) fan->answer();
    };
    upstream.tls = worker.node_tls(targets[i]->http_address);
    fan->calls.push_back(worker.pool().start(targets[i]->http_address, std::move(upstream),
                                             control_timeouts(*topology), std::move(cb)));
  }
  std::weak_ptr<FanOut> weak = fan;
  fan->writer.on_client_close([weak] {
    if (auto f = weak.lock()) {
      for (auto& c : f->calls) c->cancel();
    }
  });
}

}  // namespace pdr::router::proxy
