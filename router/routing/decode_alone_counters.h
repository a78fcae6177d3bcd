// What conditional disaggregation (decode_alone.h) counts, and its /metrics section. A member of
// ProxyCounters (router/proxy/proxy_counters.h), bumped by every HTTP worker with relaxed atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::routing {

// Requests sent to their decode alone, by DecodeAloneReason.
using DecodeAloneCounters = std::array<std::atomic<uint64_t>, 4>;

// pdrouter_decode_alone_total{reason}.
void write_decode_alone_metrics(MetricsWriter& out, const DecodeAloneCounters& counters);

}  // namespace pdr::router::routing
