// GET /metrics: what the load scrape (router/proxy/engine_load_scrape.h) last read of each node
// (discovery/engine_load.h), written only while fresh (a stale or never read node has none of
// the figure gauges, so a dashboard never shows an old figure as current): requests running and
// waiting and KV cache usage per node, the same per DP rank (label `rank`, 0 ..
// kMaxMetricRanks - 1) when the page had engine labels, and for every node read at least once
// the age of its last read. Then the scrape's counters. docs/metrics.md lists them.
#pragma once

#include "discovery/instance.h"
#include "proto/base/metrics_writer.h"

namespace pdr::router {

void write_node_engine_load_metrics(MetricsWriter& out, const discovery::RegistrySnapshot& snapshot,
                                    discovery::Clock::time_point now);

}  // namespace pdr::router
