// What the admission queue (admission_queue.h) counts, and its /metrics section. A member of
// ProxyCounters (proxy_counters.h): the queue keeps its gauges here (stored under its lock,
// read without it), the workers bump the rest with relaxed atomics. Its refusals (queue_full,
// queue_timeout) are counted with the others in pdrouter_requests_refused_total.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "proto/base/latency_histogram.h"

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::proxy {

// Priority classes of the admission queue: 0 (lowest) .. kPriorityClasses - 1 (highest).
inline constexpr uint32_t kPriorityClasses = 8;

struct AdmissionQueueCounters {
  std::array<std::atomic<uint32_t>, kPriorityClasses> depth{};  // gauge: waiters per class
  std::atomic<uint64_t> bytes{0};                               // gauge: their body bytes
  std::atomic<uint64_t> client_gone{0};  // waiters whose client went away (no leg was sent)
  // Arrival in the queue to the slot handed over, of the requests that waited and were admitted.
  LatencyHistogram wait;
};

// pdrouter_admission_queue_depth{priority}, pdrouter_admission_queue_bytes,
// pdrouter_admission_queue_client_gone_total, pdrouter_admission_queue_wait_seconds.
void write_admission_queue_metrics(MetricsWriter& out, const AdmissionQueueCounters& counters);

}  // namespace pdr::router::proxy
