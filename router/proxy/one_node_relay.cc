#include "router/proxy/one_node_relay.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "discovery/load_charge.h"
#include "router/proxy/access_logging.h"
#include "router/proxy/admission.h"
#include "router/proxy/client_api.h"
#include "router/policies/policy.h"
#include "router/proxy/node_endpoints.h"
#include "router/routing/pairing.h"
#include "router/routing/session_timer.h"

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
  // A request in flight on `node` (discovery/load_charge.h): given back by end(), or by the
  // relay's destruction if it never ends.
  discovery::LoadCharge charge;
  AdmissionSlot admission;
  clients::TenantTicket ticket;
  WorkerContext* worker = nullptr;
  OneNodeClass node_class = OneNodeClass::kAnyNode;
  bool head_sent = false;
  bool ended = false;
  SessionTimer stall;  // armed while reading is paused for a client that does not read
  // The access log's record (null: log off): the node answering is named as its decode.
  std::unique_ptr<clients::AccessRecord> record;
  std::chrono::steady_clock::time_point arrived_at{};
  int status = 0;
  uint64_t bytes_out = 0;

  void end(Outcome outcome) {
    if (ended) return;
    ended = true;
    charge.release();
    admission.release();
    ticket.release();
    count(*worker, node_class, outcome);
    if (record) {
      record->decode = node->key;
      log_answered(worker->shared(), std::move(record), arrived_at, status,
                   outcome == kRelayed ? "done" : status == 0 && writer.client_gone() ? "cancelled" : "failed",
                   bytes_out);
    }
  }
};

}  // namespace

namespace {

// The relay once the request holds a slot.
void relay_to_node(WorkerContext& worker, http::Request& request, http::ResponseWriter writer, OneNodeClass node_class,
           clients::TenantTicket ticket, std::unique_ptr<clients::AccessRecord> record, AdmissionSlot slot);

// What admit_or_queue() continues with (admission.h).
struct OneNodeAdmission {
  WorkerContext* worker;
  OneNodeClass node_class;
  clients::TenantTicket ticket;
  std::unique_ptr<clients::AccessRecord> record;

  void admitted(http::Request& request, http::ResponseWriter writer, AdmissionSlot slot, const QueueWait& wait) {
    if (record && wait.waited()) record->queue_ms = std::chrono::duration<double, std::milli>(wait.end - wait.start).count();
    relay_to_node(*worker, request, std::move(writer), node_class, std::move(ticket), std::move(record), std::move(slot));
  }
  void refused(const http::Request& request, const Answered& answered) {
    count(*worker, node_class, kRefused);
    log_answered(worker->shared(), std::move(record), request.head_at, answered.status,
                 answered.status == 0 ? "cancelled" : "refused", answered.bytes);
  }
};

}  // namespace

void serve_one_node(WorkerContext& worker, http::Request& request, http::ResponseWriter writer,
                    OneNodeClass node_class, clients::TenantTicket ticket, std::unique_ptr<clients::AccessRecord> record,
                    QueuePlace place) {
  Answered answered;
  // The same admission as a P/D request (admission.h): a flood of render calls, each answered
  // with megabytes, is bounded by limits.max_concurrent_requests like generation. The slot is
  // given back when the relay ends (or at once when nothing is relayed).
  if (refuse_while_shutting_down(worker.shared(), writer, request.path, &answered)) {
    count(worker, node_class, kRefused);
    log_answered(worker.shared(), std::move(record), request.head_at, answered.status, "refused", answered.bytes);
    return;
  }
  // The body and the one wire copy the upstream client renders it into (admission.h).
  admit_or_queue(worker, request, writer, 1, std::move(place),
                 OneNodeAdmission{&worker, node_class, std::move(ticket), std::move(record)});
}

namespace {

void relay_to_node(WorkerContext& worker, http::Request& request, http::ResponseWriter writer, OneNodeClass node_class,
           clients::TenantTicket ticket, std::unique_ptr<clients::AccessRecord> record, AdmissionSlot slot) {
  // Answered here without a node: logged as refused (access_logging.h).
  const auto refused = [&](http::Response response) {
    log_answered(worker.shared(), std::move(record), request.head_at, response.status, "refused", response.body.size());
    writer.send(std::move(response));
  };
  const auto& topology = worker.topology();
  bool declared = false;
  InstancePtr node = pick(worker, node_class, &declared);
  if (!declared && (node_class == OneNodeClass::kPooling || node_class == OneNodeClass::kAudio)) {
    count(worker, node_class, kNotSupported);
    const std::string_view capability = capability_of(node_class);
    refused(api_error_response(
        request.path, 501,
        request.path + " is not served: no node declares it serves " + std::string(capability) +
            " (label " + std::string(kServesLabel) + "=" + std::string(capability) +
            "); a prefill/decode fleet serves a generative model",
        "not_supported_error", "not_supported"));
    return;
  }
  if (!node) {
    count(worker, node_class, kNoNode);
    refused(
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
  relay->admission = std::move(slot);
  relay->ticket = std::move(ticket);
  relay->record = std::move(record);
  relay->arrived_at = request.head_at;
  relay->worker = &worker;
  relay->node_class = node_class;
  relay->charge = discovery::LoadCharge(*node, std::nullopt);

  http::UpstreamCallbacks cb;
  cb.on_head = [relay](int status, const std::vector<http::Header>& headers) {
    std::vector<http::Header> out;
    for (const http::Header& h : headers) {
      if (http::iequals(h.name, "Content-Type")) out.push_back(h);
    }
    if (relay->record) {
      relay->record->stream =
          !out.empty() && out[0].value.size() >= 17 && http::iequals(out[0].value.substr(0, 17), "text/event-stream");
    }
    relay->head_sent = relay->writer.start_stream(status, std::move(out));
    relay->status = status;
    if (relay->record) {
      relay->record->ttft_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - relay->arrived_at).count();
    }
  };
  cb.on_body = [relay](std::string_view chunk) {
    relay->writer.write(chunk);
    relay->bytes_out += chunk.size();
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
    if (relay->head_sent) {
      relay->end(kFailed);
      relay->writer.abort();  // the client sees a truncated answer, as when the node dies
      return;
    }
    const auto call = relay->call.lock();
    const bool timeout = call && http::is_timeout(call->failure());
    http::Response response = api_error_response(path, timeout ? 504 : 502, "instance " + key + ": " + error.message(),
                                                 "server_error", "upstream_failed");
    relay->status = response.status;
    relay->bytes_out = response.body.size();
    relay->end(kFailed);
    relay->writer.send(std::move(response));
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

}  // namespace

}  // namespace pdr::router::proxy
