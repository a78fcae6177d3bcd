// GET /engine_metrics: every up node's own /metrics (vLLM's Prometheus page) merged into one page,
// each sample labelled with the node (pdrouter_node="host:port", pdrouter_role="prefill|decode|
// ..."), so one Prometheus scrape of pdrouter sees the whole fleet (as SGLang's gateway
// /engine_metrics does). Merging rules and the limits on what a node may send:
// proto/prometheus_merge.h.
//
// Fetch: GET /metrics to every routable instance at once, with connectors.upstream_api_key as
// Bearer when configured (never the caller's Authorization), the usual connect / first-byte /
// idle timeouts, and a whole-fetch deadline of kEngineMetricsDeadline; at most
// kMaxNodeMetricsBytes of a node's answer are read (beyond: that node failed). The answer is 200
// text/plain (version 0.0.4) as soon as every node answered or failed or the deadline passed; it
// always ends with one pdrouter_engine_metrics_scrape_ok{node,role} gauge per node (1 read, 0
// failed), so a failing node is visible. No node up: 200 with only that (empty) family.
//
// Where it is served: the admin listener, without the admin key, like pdrouter's own /metrics:
// vLLM's /metrics is not behind its --api-key either (only /v1 routes are), and smg's
// /engine_metrics sits with its other unauthenticated metrics. It costs one GET per node per
// call, so keep it off the client listener (it is, Listener::kAdmin).
//
// Counted (process-wide): scrapes, node fetches by result, sample lines refused as malformed,
// dropped by type conflicts or over the limits (pdrouter_engine_metrics_*).
//
// Worker thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "router/http/http_message.h"
#include "router/http/response_writer.h"
#include "router/proxy/proxy_shared.h"

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::proxy {

inline constexpr std::chrono::milliseconds kEngineMetricsDeadline{10000};
inline constexpr size_t kMaxNodeMetricsBytes = 8 << 20;

struct EngineMetricsCounters {
  std::atomic<uint64_t> scrapes{0}, nodes_ok{0}, nodes_failed{0}, malformed_lines{0}, conflicts{0}, over_limit{0};
};
EngineMetricsCounters& engine_metrics_counters();  // one per process

void serve_engine_metrics(WorkerContext& worker, const http::Request& request, http::ResponseWriter writer);

void write_engine_metrics_metrics(MetricsWriter& out);

}  // namespace pdr::router::proxy
