#include "router/proxy/one_node_counters.h"

#include "proto/base/metrics_writer.h"
#include "router/proxy/one_node_relay.h"

namespace pdr::router::proxy {

static_assert(std::tuple_size_v<OneNodeCounters> == kOneNodeClassCount);

void write_one_node_metrics(MetricsWriter& out, const OneNodeCounters& counters) {
  constexpr std::array<const char*, 5> kClasses{"render", "any_node", "pooling", "audio", "pass_through"};
  constexpr std::array<const char*, 5> kOutcomes{"relayed", "not_supported", "no_node", "failed", "refused"};
  for (size_t k = 0; k < kClasses.size(); ++k) {
    for (size_t o = 0; o < kOutcomes.size(); ++o) {
      out.counter("pdrouter_one_node_requests_total",
                  "Requests of the one-node endpoints (render, tokenize, pooling, audio, pass-through) by outcome",
                  static_cast<double>(counters[k][o].load(std::memory_order_relaxed)),
                  {{"endpoint_class", kClasses[k]}, {"outcome", kOutcomes[o]}});
    }
  }
}

}  // namespace pdr::router::proxy
