// What session affinity (session_affinity.h) counts, and its /metrics section. A member of
// ProxyCounters (router/proxy/proxy_counters.h), bumped by every HTTP worker with relaxed atomics.
#pragma once

#include <atomic>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::routing {

class SessionTable;

struct SessionAffinityCounters {
  using Counter = std::atomic<uint64_t>;
  Counter hits{0};     // a bound session routed to its bound nodes
  Counter misses{0};   // a session with no binding (new, expired or evicted)
  Counter spills{0};   // a bound node left because it was overloaded (session_spill.h)
  Counter broken{0};   // a bound node gone, not up, ejected or no longer compatible
  Counter rebinds{0};  // a session's binding moved to another node
  Counter bad_ids{0};  // session ids refused (too long, not printable ASCII, not a string)
  // etcd sharing (router/session_mirror.h): bindings written, writes that failed, bindings read
  // from other replicas, values read that were refused, bindings dropped because the queue to
  // the replicator was full.
  Counter etcd_puts{0}, etcd_put_failures{0}, etcd_mirrored{0}, etcd_bad_values{0}, etcd_dropped{0};
};

// pdrouter_session_affinity_*; `table` gives the binding count and evictions (null: zeros).
void write_session_affinity_metrics(MetricsWriter& out, const SessionAffinityCounters& counters,
                                    const SessionTable* table);

}  // namespace pdr::router::routing
