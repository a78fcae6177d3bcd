// One GET /metrics to one node, the way pdrouter reads nodes' Prometheus pages (GET
// /engine_metrics, engine_metrics.h, and the periodic load scrape, engine_load_scrape.h):
// connectors.upstream_api_key as Bearer when configured (never a client's credential), the
// node's TLS (node_tls.h), the body kept only from a 200 answer and only up to `max_bytes` (a
// larger one is abandoned at once: the call is cancelled and the answer is kTooLarge).
//
// `done` runs exactly once, on the worker's loop, with the outcome, unless the caller cancels the
// returned call first (then never); never before fetch_node_metrics returns (the pool never
// calls back synchronously). Worker thread only.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "discovery/instance.h"
#include "router/http/upstream_client.h"

namespace pdr::router::proxy {

class WorkerContext;

struct NodeMetricsAnswer {
  enum class Result { kOk, kError, kStatus, kTooLarge };
  Result result = Result::kError;
  int status = 0;                 // the answer's, 0 when none
  http::UpstreamFailure failure = http::UpstreamFailure::kNone;  // kError: why
  std::string body;               // kOk: the whole page
};

std::shared_ptr<http::UpstreamCall> fetch_node_metrics(WorkerContext& worker, const discovery::Instance& node,
                                                       const http::UpstreamTimeouts& timeouts, size_t max_bytes,
                                                       std::function<void(NodeMetricsAnswer&&)> done);

}  // namespace pdr::router::proxy
