// What the aborts sent to tokens-only nodes (abort_requests.h) count, and their /metrics
// section. A member of ProxyCounters (proxy_counters.h), bumped by every HTTP worker with relaxed
// atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::proxy {

// POST /abort_requests sent for cancelled legs, by answer: [2xx, other or no answer].
using AbortRequestsCounters = std::array<std::atomic<uint64_t>, 2>;

// pdrouter_abort_requests_total{result}.
void write_abort_requests_metrics(MetricsWriter& out, const AbortRequestsCounters& counters);

}  // namespace pdr::router::proxy
