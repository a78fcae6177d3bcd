// What the pre-steps (pre_step.h) count, and their /metrics section: Mooncake's bootstrap /query
// look-ups of the prefill's engine table (mooncake_cache.h), by result. A member of ProxyCounters
// (router/proxy/proxy_counters.h), bumped by every HTTP worker with relaxed atomics.
#pragma once

#include <atomic>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::routing {

// Tables got (from the worker's cache or a /query answer), and look-ups that failed.
struct BootstrapQueryCounters {
  std::atomic<uint64_t> ok{0}, failed{0};
};

// pdrouter_bootstrap_queries_total{result}.
void write_bootstrap_query_metrics(MetricsWriter& out, const BootstrapQueryCounters& counters);

}  // namespace pdr::router::routing
