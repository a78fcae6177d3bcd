#include "router/routing/session_affinity_counters.h"

#include "proto/base/metrics_writer.h"
#include "router/routing/session_table.h"

namespace pdr::router::routing {

void write_session_affinity_metrics(MetricsWriter& out, const SessionAffinityCounters& c, const SessionTable* table) {
  auto value = [](const SessionAffinityCounters::Counter& n) { return static_cast<double>(n.load(std::memory_order_relaxed)); };
  out.counter("pdrouter_session_affinity_hits_total", "Session turns routed to the nodes their session is bound to",
              value(c.hits));
  out.counter("pdrouter_session_affinity_misses_total",
              "Session turns whose session had no binding (new, expired or evicted)", value(c.misses));
  out.counter("pdrouter_session_affinity_spills_total",
              "Session turns that left a bound node because it was overloaded beyond the spill margin",
              value(c.spills));
  out.counter("pdrouter_session_affinity_broken_total",
              "Session turns whose bound node had left, was not up, was ejected or no longer paired", value(c.broken));
  out.counter("pdrouter_session_affinity_rebinds_total", "Session bindings moved to another node", value(c.rebinds));
  out.counter("pdrouter_session_affinity_bad_ids_total",
              "Session ids ignored: empty, too long, not printable ASCII or not a JSON string", value(c.bad_ids));
  const SessionTable::Stats s = table != nullptr ? table->stats() : SessionTable::Stats{};
  out.gauge("pdrouter_session_affinity_sessions", "Session bindings held (local and mirrored)",
            static_cast<double>(s.entries));
  out.counter("pdrouter_session_affinity_evictions_total",
              "Session bindings dropped, by reason (max_sessions: least recently used; idle_ttl)",
              static_cast<double>(s.evicted), {{"reason", "max_sessions"}});
  out.counter("pdrouter_session_affinity_evictions_total",
              "Session bindings dropped, by reason (max_sessions: least recently used; idle_ttl)",
              static_cast<double>(s.expired), {{"reason", "idle_ttl"}});
  out.counter("pdrouter_session_affinity_etcd_ops_total", "Session binding operations with etcd, by operation",
              value(c.etcd_puts), {{"op", "put"}});
  out.counter("pdrouter_session_affinity_etcd_ops_total", "Session binding operations with etcd, by operation",
              value(c.etcd_mirrored), {{"op", "mirrored"}});
  out.counter("pdrouter_session_affinity_etcd_failures_total", "Session binding writes to etcd that failed or were dropped, by reason",
              value(c.etcd_put_failures), {{"reason", "put_failed"}});
  out.counter("pdrouter_session_affinity_etcd_failures_total", "Session binding writes to etcd that failed or were dropped, by reason",
              value(c.etcd_dropped), {{"reason", "queue_full"}});
  out.counter("pdrouter_session_affinity_etcd_failures_total", "Session binding writes to etcd that failed or were dropped, by reason",
              value(c.etcd_bad_values), {{"reason", "bad_value"}});
}

}  // namespace pdr::router::routing
