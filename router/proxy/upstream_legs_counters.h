// What the upstream legs count about their connections (upstream_port.h, Call::reused_connection),
// and their /metrics section: many legs on new connections mean keep-alive to the nodes is not
// working. A member of ProxyCounters (proxy_counters.h), bumped by every HTTP worker with relaxed
// atomics when a leg gets its answer (ProxySession::node_answered).
#pragma once

#include <atomic>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::proxy {

// Legs answered on a freshly connected socket, and on a pooled keep-alive connection.
struct UpstreamLegCounters {
  std::atomic<uint64_t> on_new_connection{0}, on_pooled_connection{0};

  void answered(bool reused_connection) {
    (reused_connection ? on_pooled_connection : on_new_connection).fetch_add(1, std::memory_order_relaxed);
  }
};

// pdrouter_upstream_legs_total{connection}.
void write_upstream_leg_metrics(MetricsWriter& out, const UpstreamLegCounters& counters);

}  // namespace pdr::router::proxy
