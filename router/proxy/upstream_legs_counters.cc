#include "router/proxy/upstream_legs_counters.h"

#include "proto/base/metrics_writer.h"

namespace pdr::router::proxy {

void write_upstream_leg_metrics(MetricsWriter& out, const UpstreamLegCounters& c) {
  out.counter("pdrouter_upstream_legs_total",
              "Upstream legs that got an answer, by connection (many 'new' means keep-alive is not working)",
              static_cast<double>(c.on_new_connection.load(std::memory_order_relaxed)), {{"connection", "new"}});
  out.counter("pdrouter_upstream_legs_total",
              "Upstream legs that got an answer, by connection (many 'new' means keep-alive is not working)",
              static_cast<double>(c.on_pooled_connection.load(std::memory_order_relaxed)),
              {{"connection", "pooled"}});
}

}  // namespace pdr::router::proxy
