#include "router/proxy/health_generate.h"

#include <vector>

#include "proto/base/metrics_writer.h"
#include "router/http/json_error.h"
#include "proto/json_splice.h"
#include "router/routing/pairing.h"
#include "router/routing/session_timer.h"

namespace pdr::router::proxy {

namespace {

constexpr size_t kMaxProbeAnswer = 64 * 1024;
constexpr std::string_view kProbeBody = R"({"prompt":"ping","max_tokens":1,"stream":false})";

// The client listener as seen from this host: a wildcard bind is reached over loopback.
std::string loopback_host(const std::string& bound) {
  if (bound.empty() || bound == "0.0.0.0") return "127.0.0.1";
  if (bound == "::") return "::1";
  return bound;
}

// "message" and "code" of an OpenAI-style error body; empty when it is not one.
void read_error(std::string_view body, std::string* message, std::string* code) {
  proto::JsonObjectBody outer, inner;
  if (!proto::JsonObjectBody::parse(body, proto::JsonLimits(), &outer)) return;
  const auto error = outer.get_raw("error");
  if (!error || !proto::JsonObjectBody::parse(*error, proto::JsonLimits(), &inner)) return;
  std::optional<std::string> m, c;
  if (inner.get_string("message", &m) && m) *message = std::move(*m);
  if (inner.get_string("code", &c) && c) *code = std::move(*c);
}

}  // namespace

struct HealthGenerate::Probe : std::enable_shared_from_this<HealthGenerate::Probe> {
  HealthGenerate* owner = nullptr;  // null once the owner is gone
  std::vector<http::ResponseWriter> waiters;
  std::shared_ptr<http::UpstreamCall> call;
  SessionTimer deadline;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  int status = 0;
  std::string body;
  bool done = false;

  void finish(int answer_status, std::string answer_body) {
    if (done) return;
    done = true;
    const std::shared_ptr<Probe> keep = shared_from_this();  // the owner's reference goes below
    deadline.stop();
    if (call) call->cancel();
    HealthGenerateCounters& c = health_generate_counters();
    (answer_status == 200 ? c.ok : c.failed).fetch_add(1, std::memory_order_relaxed);
    for (http::ResponseWriter& w : waiters) w.send(http::Response::json(answer_status, answer_body));
    waiters.clear();
    if (owner != nullptr) {
      owner->answered_at_ = std::chrono::steady_clock::now();
      owner->last_status_ = answer_status;
      owner->last_body_ = std::move(answer_body);
      owner->in_flight_.reset();
    }
  }

  void failed(std::string message, std::string_view code) {
    finish(503, http::error_response(503, message, "server_error", code).body);
  }

  void complete() {
    if (status == 200) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
      proto::JsonObjectWriter out;
      out.string("status", "ok").integer("latency_ms", static_cast<int64_t>(ms.count()));
      return finish(200, out.finish());
    }
    std::string message, code;
    read_error(body, &message, &code);
    std::string leg;
    if (code.starts_with("prefill")) leg = "the prefill leg failed: ";
    else if (code.starts_with("decode")) leg = "the decode leg failed: ";
    failed("health_generate: " + leg + "HTTP " + std::to_string(status) + (message.empty() ? "" : ": " + message),
           code.empty() ? "health_generate_failed" : code);
  }
};

HealthGenerateCounters& health_generate_counters() {
  static HealthGenerateCounters counters;
  return counters;
}

HealthGenerate::~HealthGenerate() {
  if (!in_flight_) return;
  in_flight_->owner = nullptr;
  in_flight_->done = true;
  in_flight_->deadline.stop();
  if (in_flight_->call) in_flight_->call->cancel();
}

void HealthGenerate::serve(WorkerContext& worker, const http::Request& request, http::ResponseWriter writer,
                           uint16_t own_port) {
  HealthGenerateCounters& counters = health_generate_counters();
  const auto now = std::chrono::steady_clock::now();
  if (last_status_ != 0 && now - answered_at_ < kHealthGenerateReuse) {
    counters.reused.fetch_add(1, std::memory_order_relaxed);
    writer.send(http::Response::json(last_status_, last_body_));
    return;
  }
  if (in_flight_) {
    counters.shared.fetch_add(1, std::memory_order_relaxed);
    in_flight_->waiters.push_back(std::move(writer));
    return;
  }
  if (Status st = any_pair(*worker.registry()); !st) {
    counters.no_pair.fetch_add(1, std::memory_order_relaxed);
    writer.send(http::error_response(503, "health_generate: no prefill/decode pair is up: " + st.message(),
                                     "server_error", "no_pair"));
    return;
  }
  auto probe = std::make_shared<Probe>();
  probe->owner = this;
  probe->waiters.push_back(std::move(writer));
  in_flight_ = probe;
  const auto& topology = worker.topology();
  http::UpstreamRequest upstream;
  upstream.method = "POST";
  upstream.path = "/v1/completions";
  upstream.headers.push_back({"Content-Type", "application/json"});
  // The probe's request passes pdrouter's own client key check with the prober's credential.
  if (auto auth = request.header("Authorization")) upstream.headers.push_back({"Authorization", std::string(*auth)});
  if (auto key = request.header("x-api-key")) upstream.headers.push_back({"x-api-key", std::string(*key)});
  upstream.body = std::string(kProbeBody);
  http::UpstreamCallbacks cb;
  cb.on_head = [probe](int status, const std::vector<http::Header>&) { probe->status = status; };
  cb.on_body = [probe](std::string_view chunk) {
    if (probe->body.size() + chunk.size() <= kMaxProbeAnswer) probe->body.append(chunk);
  };
  cb.on_complete = [probe] { probe->complete(); };
  cb.on_error = [probe](const Status& error) {
    probe->failed("health_generate: the probe request through pdrouter failed: " + error.message(),
                  "health_generate_failed");
  };
  std::weak_ptr<Probe> weak = probe;
  probe->deadline.start(worker.timers(), kHealthGenerateDeadline, [weak] {
    if (auto p = weak.lock()) {
      p->failed("health_generate: no answer within " + std::to_string(kHealthGenerateDeadline.count()) + " ms",
                "health_generate_timeout");
    }
  });
  const proto::HostPort self{loopback_host(topology->listeners.http.host), own_port};
  const http::UpstreamTimeouts timeouts{topology->timeouts.connect, kHealthGenerateDeadline, kHealthGenerateDeadline};
  upstream.tls = worker.self_tls();  // listeners.tls: our own certificate, pinned
  probe->call = worker.pool().start(self, std::move(upstream), timeouts, std::move(cb));
}

void write_health_generate_metrics(MetricsWriter& out) {
  const HealthGenerateCounters& c = health_generate_counters();
  const char* help =
      "GET /health_generate answers by result: ok/failed (a probe ran), no_pair (none sent), shared (joined the "
      "probe in flight), reused (a probe answer under 1 s old)";
  for (const auto& [result, counter] : {std::pair<const char*, const std::atomic<uint64_t>*>{"ok", &c.ok},
                                        {"failed", &c.failed},
                                        {"no_pair", &c.no_pair},
                                        {"shared", &c.shared},
                                        {"reused", &c.reused}}) {
    out.counter("pdrouter_health_generate_total", help, static_cast<double>(counter->load(std::memory_order_relaxed)),
                {{"result", result}});
  }
}

}  // namespace pdr::router::proxy
