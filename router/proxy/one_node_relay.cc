#include "router/proxy/one_node_relay.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "router/proxy/admission.h"
#include "router/proxy/client_api.h"
#include "router/policies/policy.h"
#include "router/proxy/node_endpoints.h"
#include "router/proxy/pairing.h"
#include "router/proxy/session_timer.h"

namespace pdr::router::proxy {
namespace {

enum Outcome : size_t { kRelayed = 0, kNotSupported = 1, kNoNode = 2, kFailed = 3, kRefused = 4 };

void count(WorkerContext& worker, OneNodeClass node_class, Outcome outcome) {
  ProxyCounters::bump(worker.counters().one_node[static_cast<size_t>(node_class)][outcome]);
}

std::string_view capability_of(OneNodeClass node_class) {
  switch (node_class) {
    case OneNodeClass::kRender: return kServesRender;
    case OneNodeClass::kPooling: return kServesPooling;
    case OneNodeClass::kAudio: return kServesAudio;
    case OneNodeClass::kAnyNode:
    case OneNodeClass::kPassThrough: return {};
  }
  return {};
}

// Eligibility before the "up" check (see the header); `declared`: the node names the capability.
bool eligible(const discovery::Instance& inst, OneNodeClass node_class, bool any_declared) {
  if (node_class == OneNodeClass::kPassThrough) return inst.role == proto::Role::kDecode;
  const std::string_view capability = capability_of(node_class);
  if (capability.empty()) return true;
  if (serves_capability(inst.labels, capability)) return true;
  return node_class == OneNodeClass::kRender && !any_declared;
}

// The least loaded eligible node (outstanding / dp_size), ties rotating from a random start.
// `declared`: some registry entry (up or not) names the class's capability.
InstancePtr pick(WorkerContext& worker, OneNodeClass node_class, bool* declared) {
  const auto& snapshot = worker.registry();
  const std::string_view capability = capability_of(node_class);
  *declared = false;
  bool up_declared = false;
  for (const auto& inst : snapshot->instances) {
    if (!capability.empty() && serves_capability(inst->labels, capability)) {
      *declared = true;
      up_declared = up_declared || routable(*inst);
    }
  }
  std::vector<const InstancePtr*> nodes;
  for (const auto& inst : snapshot->instances) {
    if (routable(*inst) && eligible(*inst, node_class, up_declared)) nodes.push_back(&inst);
  }
  if (nodes.empty()) return nullptr;
  return *least_loaded_node(nodes, worker.random() % nodes.size());
}

// The relay of one answer: the writer, the call, the node's in-flight count and the request's
// admission slot, held until the end.
struct Relay {
  http::ResponseWriter writer;
  std::weak_ptr<http::UpstreamCall> call;
  InstancePtr node;
  AdmissionSlot admission;
  WorkerContext* worker = nullptr;
  OneNodeClass node_class = OneNodeClass::kAnyNode;
  bool head_sent = false;
  bool ended = false;
  SessionTimer stall;  // armed while reading is paused for a client that does not read

  void end(Outcome outcome) {
    if (ended) return;
    ended = true;
    node->liveness->outstanding.fetch_sub(1, std::memory_order_relaxed);
    admission.release();
    count(*worker, node_class, outcome);
  }
};

}  // namespace

bool serves_capability(const proto::Labels& labels, std::string_view capability) {
  for (const auto& [key, value] : labels) {
    if (key != kServesLabel) continue;
    std::string_view list = value;
    while (!list.empty()) {
      const size_t comma = list.find(',');
      std::string_view item = list.substr(0, comma);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      if (item == capability) return true;
      if (comma == std::string_view::npos) break;
      list.remove_prefix(comma + 1);
    }
  }
  return false;
}

void serve_one_node(WorkerContext& worker, http::Request& request, http::ResponseWriter writer,
                    OneNodeClass node_class) {
  // The same admission as a P/D request (admission.h): a flood of render calls, each answered
  // with megabytes, is bounded by limits.max_concurrent_requests like generation. The slot is
  // given back when this function returns without relaying, else when the relay ends.
  if (refuse_while_shutting_down(worker.shared(), writer, request.path)) {
    count(worker, node_class, kRefused);
    return;
  }
  // The body and the one wire copy the upstream client renders it into (admission.h).
  std::optional<AdmissionSlot> admission = take_admission_slot(worker, request, 1, writer);
  if (!admission) {
    count(worker, node_class, kRefused);
    return;
  }
  const auto& topology = worker.topology();
  bool declared = false;
  InstancePtr node = pick(worker, node_class, &declared);
  if (!declared && (node_class == OneNodeClass::kPooling || node_class == OneNodeClass::kAudio)) {
    count(worker, node_class, kNotSupported);
    const std::string_view capability = capability_of(node_class);
    writer.send(api_error_response(
        request.path, 501,
        request.path + " is not served: no node declares it serves " + std::string(capability) +
            " (label " + std::string(kServesLabel) + "=" + std::string(capability) +
            "); a prefill/decode fleet serves a generative model",
        "not_supported_error", "not_supported"));
    return;
  }
  if (!node) {
    count(worker, node_class, kNoNode);
    writer.send(
        api_error_response(request.path, 503, "no eligible instance is up for " + request.path, "server_error", "no_node"));
    return;
  }
  http::UpstreamRequest upstream;
  upstream.method = request.method;
  upstream.path = request.target;
  for (const char* name : {"Content-Type", "Accept", "X-Request-Id"}) {
    if (auto value = request.header(name)) upstream.headers.push_back({name, std::string(*value)});
  }
  const std::string client_auth = client_authorization(request);
  // A pass-through path is one pdrouter knows nothing about: the router's own upstream key never
  // goes with it (it would let any client call what the node guards with that key); the
  // client's own credentials do.
  std::string auth = node_class == OneNodeClass::kPassThrough ? client_auth
                                                               : upstream_authorization(*topology, client_auth);
  if (!auth.empty()) upstream.headers.push_back({"Authorization", std::move(auth)});
  upstream.body = std::move(request.body);  // the request is done with: no second copy of an upload

  auto relay = std::make_shared<Relay>();
  relay->writer = std::move(writer);
  relay->node = node;
  relay->admission = *std::move(admission);
  relay->worker = &worker;
  relay->node_class = node_class;
  node->liveness->outstanding.fetch_add(1, std::memory_order_relaxed);

  http::UpstreamCallbacks cb;
  cb.on_head = [relay](int status, const std::vector<http::Header>& headers) {
    std::vector<http::Header> out;
    for (const http::Header& h : headers) {
      if (http::iequals(h.name, "Content-Type")) out.push_back(h);
    }
    relay->head_sent = relay->writer.start_stream(status, std::move(out));
  };
  cb.on_body = [relay](std::string_view chunk) {
    relay->writer.write(chunk);
    if (relay->writer.buffered_bytes() >= kRelayHighWater) {
      if (auto call = relay->call.lock()) {
        call->pause();
        ProxyCounters::bump(relay->worker->counters().backpressure_pauses);
        std::weak_ptr<Relay> weak = relay;
        relay->writer.on_drain([weak] {
          auto r = weak.lock();
          if (!r) return;
          r->stall.stop();
          if (auto c = r->call.lock()) c->resume();
        });
        // A client that reads nothing for timeouts.client_write is cut, and the node's call
        // closed, as a P/D stream is: a paused read must not hold the node forever.
        const auto limit = relay->worker->topology()->timeouts.client_write;
        if (limit.count() > 0) {
          relay->stall.start(relay->worker->timers(), limit, [weak] {
            auto r = weak.lock();
            if (!r) return;
            ProxyCounters::bump(r->worker->counters().client_write_stalls);
            if (auto c = r->call.lock()) c->cancel();
            r->end(kFailed);
            r->writer.abort();
          });
        }
      }
    }
  };
  cb.on_complete = [relay] {
    relay->writer.end_stream();
    relay->end(kRelayed);
  };
  const std::string key = node->key;
  cb.on_error = [relay, key, path = request.path](const Status& error) {
    relay->end(kFailed);
    if (relay->head_sent) {
      relay->writer.abort();  // the client sees a truncated answer, as when the node dies
      return;
    }
    const auto call = relay->call.lock();
    const bool timeout = call && http::is_timeout(call->failure());
    relay->writer.send(api_error_response(path, timeout ? 504 : 502, "instance " + key + ": " + error.message(),
                                          "server_error", "upstream_failed"));
  };
  upstream.tls = worker.node_tls(node->http_address);
  auto call = worker.pool().start(node->http_address, std::move(upstream),
                                  {topology->timeouts.connect, topology->timeouts.first_byte, topology->timeouts.stream_idle},
                                  std::move(cb));
  relay->call = call;
  // A client that leaves closes the call too (the node sees the close: vLLM aborts).
  std::weak_ptr<Relay> weak = relay;
  relay->writer.on_client_close([weak] {
    auto r = weak.lock();
    if (!r) return;
    if (auto c = r->call.lock()) c->cancel();
    r->end(kFailed);
  });
}

}  // namespace pdr::router::proxy
