#include "router/etcd_metrics.h"

namespace pdr::router {

void write_etcd_metrics(MetricsWriter& out, const discovery::sources::etcd::RegistryReplicator* replicator) {
  const discovery::sources::etcd::ReplicatorStatus empty;
  const discovery::sources::etcd::ReplicatorStatus& s = replicator != nullptr ? replicator->status() : empty;
  auto d = [](const std::atomic<uint64_t>& v) { return static_cast<double>(v.load(std::memory_order_relaxed)); };
  out.gauge("pdrouter_etcd_up", "1 while etcd answers (registry.backend etcd), else 0",
            s.reachable.load(std::memory_order_relaxed) ? 1.0 : 0.0);
  out.counter("pdrouter_etcd_puts_total", "Entries this replica wrote to etcd (on change only)", d(s.puts));
  out.counter("pdrouter_etcd_deletes_total", "Entries this replica deleted from etcd", d(s.deletes));
  out.counter("pdrouter_etcd_keepalives_total", "Lease keepalives etcd acknowledged", d(s.keepalives));
  out.counter("pdrouter_etcd_watch_events_total", "Watch events received from etcd", d(s.watch_events));
  out.counter("pdrouter_etcd_resyncs_total", "Full resyncs (range, then watch) with etcd", d(s.resyncs));
  out.counter("pdrouter_etcd_failures_total", "etcd calls that failed (unreachable or refused)", d(s.failures));
  out.counter("pdrouter_etcd_bad_entries_total",
              "Key-values under <prefix>nodes/ refused one by one (over a size limit, not base64, not a registry "
              "entry); skipped, never counted as etcd unreachable",
              d(s.bad_entries));
  out.gauge("pdrouter_etcd_retry_delay_seconds",
            "While etcd fails: the wait before the next attempt (doubles per failure in a row); 0 in sync",
            d(s.retry_delay_ms) / 1000.0);
  out.gauge("pdrouter_etcd_replica_entries", "Nodes learnt from other replicas through etcd", d(s.replica_entries));
  out.gauge("pdrouter_etcd_inflight", "Puts and deletes sent to etcd and not yet answered", d(s.in_flight));
  out.gauge("pdrouter_etcd_inflight_max", "The most puts and deletes ever in flight at once (capped at 256)",
            d(s.in_flight_max));
  out.counter("pdrouter_etcd_lease_grants_total", "etcd leases this replica was granted (the first included)",
              d(s.lease_grants));
  out.counter("pdrouter_etcd_leases_lost_total",
              "Leases found gone (expired or revoked): a new lease, every entry written again", d(s.leases_lost));
  out.counter("pdrouter_etcd_conversation_puts_total", "Multi-turn entries of this replica written to etcd",
              d(s.conversation_puts));
  out.counter("pdrouter_etcd_conversation_deletes_total",
              "Multi-turn entries taken on this replica and deleted from etcd", d(s.conversation_deletes));
  out.counter("pdrouter_etcd_conversation_failures_total",
              "Multi-turn entry writes or deletes that failed or were dropped (etcd unreachable or behind)",
              d(s.conversation_failures));
  out.counter("pdrouter_etcd_conversation_mirrored_total", "Multi-turn entries of other replicas mirrored from etcd",
              d(s.conversation_mirrored));
  out.counter("pdrouter_etcd_conversation_rejected_total",
              "Multi-turn entries from etcd refused (malformed, oversized or expired)", d(s.conversation_rejected));
  out.counter("pdrouter_etcd_conversation_stale_total",
              "Deletes or puts of other replicas seen after this replica stored a newer entry for the "
              "conversation: ignored",
              d(s.conversation_stale));
}

}  // namespace pdr::router
