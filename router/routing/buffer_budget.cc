#include "router/routing/buffer_budget.h"

#include "proto/base/metrics_writer.h"

namespace pdr::router::routing {

void write_buffer_budget_metrics(MetricsWriter& out, const BufferBudget& b) {
  out.gauge("pdrouter_buffered_bytes", "Bytes of request bodies and buffered answers held (limits.max_buffered_bytes)",
            static_cast<double>(b.held.load(std::memory_order_relaxed)));
  out.counter("pdrouter_buffered_answers_over_budget_total",
              "Buffered decode answers failed because limits.max_buffered_bytes was reached",
              static_cast<double>(b.answers_over_budget.load(std::memory_order_relaxed)));
}

}  // namespace pdr::router::routing
