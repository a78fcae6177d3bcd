#include "router/proxy/orphan_legs_counters.h"

#include "proto/base/metrics_writer.h"

namespace pdr::router::proxy {

void write_orphan_leg_metrics(MetricsWriter& out, const OrphanLegCounters& c) {
  out.gauge("pdrouter_orphan_prefill_legs",
            "Concurrent-dialect prefill legs still open after their request ended "
            "(bounded per node by limits.max_orphan_legs_per_node)",
            static_cast<double>(c.open.load(std::memory_order_relaxed)));
  out.counter("pdrouter_orphan_prefill_closes_total",
              "Orphaned prefill legs closed by pdrouter (grace period, prefill deadline or eviction)",
              static_cast<double>(c.closed.load(std::memory_order_relaxed)));
  out.counter("pdrouter_orphan_prefill_evictions_total",
              "Orphaned prefill legs closed early: a newer orphan of the node went over limits.max_orphan_legs_per_node",
              static_cast<double>(c.evicted.load(std::memory_order_relaxed)));
}

}  // namespace pdr::router::proxy
