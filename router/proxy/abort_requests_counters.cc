#include "router/proxy/abort_requests_counters.h"

#include "proto/base/metrics_writer.h"

namespace pdr::router::proxy {

void write_abort_requests_metrics(MetricsWriter& out, const AbortRequestsCounters& counters) {
  auto value = [](const std::atomic<uint64_t>& c) { return static_cast<double>(c.load(std::memory_order_relaxed)); };
  out.counter("pdrouter_abort_requests_total",
              "POST /abort_requests sent to tokens-only nodes for the open legs of cancelled "
              "/inference/v1/generate requests, by answer",
              value(counters[0]), {{"result", "ok"}});
  out.counter("pdrouter_abort_requests_total",
              "POST /abort_requests sent to tokens-only nodes for the open legs of cancelled "
              "/inference/v1/generate requests, by answer",
              value(counters[1]), {{"result", "failed"}});
}

}  // namespace pdr::router::proxy
