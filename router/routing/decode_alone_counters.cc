#include "router/routing/decode_alone_counters.h"

#include <string>

#include "proto/base/metrics_writer.h"
#include "router/routing/decode_alone.h"

namespace pdr::router::routing {

static_assert(std::tuple_size_v<DecodeAloneCounters> == kDecodeAloneReasonCount);

void write_decode_alone_metrics(MetricsWriter& out, const DecodeAloneCounters& counters) {
  for (size_t r = 0; r < counters.size(); ++r) {
    out.counter("pdrouter_decode_alone_total",
                "Requests sent to the decode alone, without a prefill leg (conditional_disaggregation, or n > 1), by reason",
                static_cast<double>(counters[r].load(std::memory_order_relaxed)),
                {{"reason", std::string(to_string(static_cast<DecodeAloneReason>(r)))}});
  }
}

}  // namespace pdr::router::routing
