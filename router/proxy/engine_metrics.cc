#include "router/proxy/engine_metrics.h"

#include <memory>
#include <string>
#include <vector>

#include "proto/base/metrics_writer.h"
#include "proto/prometheus_merge.h"
#include "router/proxy/node_metrics_fetch.h"
#include "router/routing/pairing.h"
#include "router/routing/session_timer.h"

namespace pdr::router::proxy {

namespace {

struct NodeFetch {
  std::string key;   // host:port
  std::string role;
  int status = 0;
  std::string body;
  bool failed = false;  // error, timeout, non-200 or too large
  bool done = false;    // answered or failed
};

struct EngineScrape {
  http::ResponseWriter writer;
  std::vector<NodeFetch> nodes;
  std::vector<std::shared_ptr<http::UpstreamCall>> calls;
  size_t pending = 0;
  SessionTimer deadline;
  bool answered = false;

  void node_done() {
    if (--pending == 0) answer();
  }

  void answer() {
    if (answered) return;
    answered = true;
    deadline.stop();
    for (auto& call : calls) {
      if (call) call->cancel();  // those still running at the deadline
    }
    EngineMetricsCounters& c = engine_metrics_counters();
    proto::PromMerger merger;
    for (const NodeFetch& n : nodes) {
      const bool ok = !n.failed && n.status == 200;
      (ok ? c.nodes_ok : c.nodes_failed).fetch_add(1, std::memory_order_relaxed);
      if (!ok) continue;
      const proto::PromPageStats s = merger.add(n.body, {{"pdrouter_node", n.key}, {"pdrouter_role", n.role}});
      c.malformed_lines.fetch_add(s.malformed, std::memory_order_relaxed);
      c.conflicts.fetch_add(s.conflicts, std::memory_order_relaxed);
      c.over_limit.fetch_add(s.over_limit, std::memory_order_relaxed);
    }
    for (const NodeFetch& n : nodes) {
      const bool ok = !n.failed && n.status == 200;
      merger.add_own("pdrouter_engine_metrics_scrape_ok",
                     "1 when pdrouter read this node's /metrics for this page, 0 when it failed", "gauge",
                     "pdrouter_engine_metrics_scrape_ok{node=\"" + proto::prom_escape_label_value(n.key) +
                         "\",role=\"" + n.role + "\"} " + (ok ? "1" : "0"));
    }
    writer.send(http::Response::text(200, merger.render(), "text/plain; version=0.0.4; charset=utf-8"));
    nodes.clear();
  }
};

}  // namespace

EngineMetricsCounters& engine_metrics_counters() {
  static EngineMetricsCounters counters;
  return counters;
}

void serve_engine_metrics(WorkerContext& worker, const http::Request&, http::ResponseWriter writer) {
  engine_metrics_counters().scrapes.fetch_add(1, std::memory_order_relaxed);
  const auto& snapshot = worker.registry();
  const auto& topology = worker.topology();
  auto scrape = std::make_shared<EngineScrape>();
  scrape->writer = std::move(writer);
  std::vector<InstancePtr> targets;
  for (const auto& inst : snapshot->instances) {
    if (routable(*inst)) targets.push_back(inst);
  }
  if (targets.empty()) return scrape->answer();
  scrape->nodes.resize(targets.size());
  scrape->pending = targets.size();
  std::weak_ptr<EngineScrape> weak = scrape;
  // The deadline holds the scrape weakly: the calls' callbacks keep it alive until they end.
  scrape->deadline.start(worker.timers(), kEngineMetricsDeadline, [weak] {
    if (auto s = weak.lock()) {
      for (NodeFetch& n : s->nodes) n.failed = n.failed || !n.done;
      s->answer();
    }
  });
  const http::UpstreamTimeouts timeouts{topology->timeouts.connect, topology->timeouts.first_byte,
                                        topology->timeouts.stream_idle};
  for (size_t i = 0; i < targets.size(); ++i) {
    NodeFetch& node = scrape->nodes[i];
    node.key = targets[i]->key;
    node.role = std::string(proto::to_string(targets[i]->role));
    scrape->calls.push_back(fetch_node_metrics(
        worker, *targets[i], timeouts, kMaxNodeMetricsBytes, [scrape, i](NodeMetricsAnswer&& answer) {
          if (scrape->answered) return;
          NodeFetch& n = scrape->nodes[i];
          n.status = answer.status;
          n.failed = answer.result != NodeMetricsAnswer::Result::kOk;
          n.body = std::move(answer.body);
          n.done = true;
          scrape->node_done();
        }));
  }
  scrape->writer.on_client_close([weak] {
    if (auto s = weak.lock()) {
      s->answered = true;
      s->deadline.stop();
      for (auto& c : s->calls) {
        if (c) c->cancel();
      }
    }
  });
}

void write_engine_metrics_metrics(MetricsWriter& out) {
  const EngineMetricsCounters& c = engine_metrics_counters();
  auto v = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  out.counter("pdrouter_engine_metrics_scrapes_total", "GET /engine_metrics calls", v(c.scrapes));
  out.counter("pdrouter_engine_metrics_node_fetches_total", "Node /metrics fetches for /engine_metrics, by result",
              v(c.nodes_ok), {{"result", "ok"}});
  out.counter("pdrouter_engine_metrics_node_fetches_total", "Node /metrics fetches for /engine_metrics, by result",
              v(c.nodes_failed), {{"result", "failed"}});
  out.counter("pdrouter_engine_metrics_dropped_lines_total",
              "Lines of node /metrics pages left out of /engine_metrics, by reason", v(c.malformed_lines),
              {{"reason", "malformed"}});
  out.counter("pdrouter_engine_metrics_dropped_lines_total",
              "Lines of node /metrics pages left out of /engine_metrics, by reason", v(c.conflicts),
              {{"reason", "type_conflict"}});
  out.counter("pdrouter_engine_metrics_dropped_lines_total",
              "Lines of node /metrics pages left out of /engine_metrics, by reason", v(c.over_limit),
              {{"reason", "over_limit"}});
}

}  // namespace pdr::router::proxy
