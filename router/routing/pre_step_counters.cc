#include "router/routing/pre_step_counters.h"

#include "proto/base/metrics_writer.h"

namespace pdr::router::routing {

void write_bootstrap_query_metrics(MetricsWriter& out, const BootstrapQueryCounters& c) {
  out.counter("pdrouter_bootstrap_queries_total", "Mooncake bootstrap /query calls by result",
              static_cast<double>(c.ok.load(std::memory_order_relaxed)), {{"result", "ok"}});
  out.counter("pdrouter_bootstrap_queries_total", "Mooncake bootstrap /query calls by result",
              static_cast<double>(c.failed.load(std::memory_order_relaxed)), {{"result", "failed"}});
}

}  // namespace pdr::router::routing
