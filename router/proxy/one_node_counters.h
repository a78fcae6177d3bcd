// What the one-node endpoints (one_node_relay.h) count, and their /metrics section. A member of
// ProxyCounters (proxy_counters.h), bumped by every HTTP worker with relaxed atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::proxy {

// [OneNodeClass: render, any_node, pooling, audio, pass_through]
// [outcome: relayed, not_supported, no_node, failed, refused].
using OneNodeCounters = std::array<std::array<std::atomic<uint64_t>, 5>, 5>;

// pdrouter_one_node_requests_total{endpoint_class,outcome}.
void write_one_node_metrics(MetricsWriter& out, const OneNodeCounters& counters);

}  // namespace pdr::router::proxy
