#include "router/proxy/node_endpoints_counters.h"

#include "proto/base/metrics_writer.h"

namespace pdr::router::proxy {

void write_models_metrics(MetricsWriter& out, const ModelsCounters& c) {
  out.counter("pdrouter_models_requests_total", "GET /v1/models answers by source",
              static_cast<double>(c.cache_hits.load(std::memory_order_relaxed)), {{"source", "cache"}});
  out.counter("pdrouter_models_requests_total", "GET /v1/models answers by source",
              static_cast<double>(c.fetches.load(std::memory_order_relaxed)), {{"source", "upstream"}});
}

void write_profile_fanout_metrics(MetricsWriter& out, const ProfileFanoutCounter& counter) {
  out.counter("pdrouter_profile_fanouts_total", "start_profile/stop_profile calls fanned out to every node",
              static_cast<double>(counter.load(std::memory_order_relaxed)));
}

}  // namespace pdr::router::proxy
