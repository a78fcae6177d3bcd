// What the orphaned prefill legs (orphan_legs.h) count, and their /metrics section. A member of
// ProxyCounters (proxy_counters.h), changed by every HTTP worker with relaxed atomics.
#pragma once

#include <atomic>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::proxy {

struct OrphanLegCounters {
  std::atomic<int64_t> open{0};  // gauge: concurrent prefill legs outliving their request
  // Of those, closed by pdrouter (grace, prefill deadline or eviction), and closed because a
  // newer orphan of the node went over its limit.
  std::atomic<uint64_t> closed{0}, evicted{0};
};

// pdrouter_orphan_prefill_legs, pdrouter_orphan_prefill_closes_total and
// pdrouter_orphan_prefill_evictions_total.
void write_orphan_leg_metrics(MetricsWriter& out, const OrphanLegCounters& counters);

}  // namespace pdr::router::proxy
