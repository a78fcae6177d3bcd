// GET /metrics: the load ledger's families (discovery/load_ledger.h), per node and per DP rank:
// requests in flight, queued uncached prefill tokens, decode sequences, KV tokens held, and the
// rate estimates with their sample counts. Labels: `node` (the instance's key; as many as the
// registry holds, which its caps bound) and `rank` (0 .. kMaxMetricRanks - 1, then `rest` for
// every rank above together, shown only for nodes with more ranks or a charge there).
// docs/metrics.md lists them.
#pragma once

#include <cstdint>

#include "proto/base/metrics_writer.h"
#include "discovery/instance.h"

namespace pdr::router {

inline constexpr uint32_t kMaxMetricRanks = 64;

void write_node_load_metrics(MetricsWriter& out, const discovery::RegistrySnapshot& snapshot,
                             discovery::Clock::time_point now);

}  // namespace pdr::router
