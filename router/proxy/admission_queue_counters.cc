#include "router/proxy/admission_queue_counters.h"

#include <string>

#include "proto/base/metrics_writer.h"

namespace pdr::router::proxy {

void write_admission_queue_metrics(MetricsWriter& out, const AdmissionQueueCounters& c) {
  for (uint32_t p = 0; p < kPriorityClasses; ++p) {
    out.gauge("pdrouter_admission_queue_depth",
              "Requests waiting in the admission queue for an in-flight slot, by priority class",
              static_cast<double>(c.depth[p].load(std::memory_order_relaxed)), {{"priority", std::to_string(p)}});
  }
  out.gauge("pdrouter_admission_queue_bytes", "Body bytes of the requests waiting in the admission queue",
            static_cast<double>(c.bytes.load(std::memory_order_relaxed)));
  out.counter("pdrouter_admission_queue_client_gone_total",
              "Requests that left the admission queue because their client went away (no leg sent)",
              static_cast<double>(c.client_gone.load(std::memory_order_relaxed)));
  const LatencyHistogram::Snapshot s = c.wait.snapshot();
  out.histogram("pdrouter_admission_queue_wait_seconds",
                "Time admitted requests waited in the admission queue for an in-flight slot",
                LatencyHistogram::kBoundSeconds, s.cumulative, s.sum_seconds, s.count);
}

}  // namespace pdr::router::proxy
