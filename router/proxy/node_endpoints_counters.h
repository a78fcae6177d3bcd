// What the endpoints that are not a P/D request (node_endpoints.h) count, and their /metrics
// sections: GET /v1/models answers by source, and the profile fan-outs. Members of ProxyCounters
// (proxy_counters.h), bumped by every HTTP worker with relaxed atomics; the two sections sit apart
// on the page, hence two writers.
#pragma once

#include <atomic>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::proxy {

// GET /v1/models answered from the worker's cache, and fetched from a decode node.
struct ModelsCounters {
  std::atomic<uint64_t> cache_hits{0}, fetches{0};
};

// POST /start_profile and /stop_profile calls fanned out to every node. The admin listener's
// service counts into the client service's (ProxyShared::profile_fanouts), so /metrics has one total.
using ProfileFanoutCounter = std::atomic<uint64_t>;

// pdrouter_models_requests_total{source}.
void write_models_metrics(MetricsWriter& out, const ModelsCounters& counters);
// pdrouter_profile_fanouts_total.
void write_profile_fanout_metrics(MetricsWriter& out, const ProfileFanoutCounter& counter);

}  // namespace pdr::router::proxy
