#include "router/node_engine_load_metrics.h"

#include <algorithm>
#include <string>

#include "discovery/engine_load.h"
#include "router/node_load_metrics.h"
#include "router/proxy/engine_load_scrape.h"

namespace pdr::router {

namespace {

void write_figures(MetricsWriter& out, const proto::EngineLoadFigures& f, const MetricsWriter::Labels& labels,
                   bool rank) {
  out.gauge(rank ? "pdrouter_node_rank_engine_requests_running" : "pdrouter_node_engine_requests_running",
            "Requests running on the node by its own /metrics (vllm:num_requests_running), last scrape",
            f.running, labels);
  out.gauge(rank ? "pdrouter_node_rank_engine_requests_waiting" : "pdrouter_node_engine_requests_waiting",
            "Requests waiting on the node by its own /metrics (vllm:num_requests_waiting), last scrape",
            f.waiting, labels);
  if (f.kv_cache_usage >= 0) {
    out.gauge(rank ? "pdrouter_node_rank_engine_kv_cache_usage" : "pdrouter_node_engine_kv_cache_usage",
              "KV cache in use on the node, 0..1, by its own /metrics (vllm:kv_cache_usage_perc), last scrape",
              f.kv_cache_usage, labels);
  }
}

}  // namespace

void write_node_engine_load_metrics(MetricsWriter& out, const discovery::RegistrySnapshot& snapshot,
                                    discovery::Clock::time_point now) {
  for (const auto& inst : snapshot.instances) {
    const discovery::EngineLoadCell& cell = inst->liveness->engine_load;
    if (cell.state().reads == 0) continue;
    const discovery::EngineLoad load = cell.node(now);
    out.gauge("pdrouter_node_engine_scrape_age_seconds", "Seconds since the load scrape last read the node's /metrics",
              std::chrono::duration<double>(load.age).count(), {{"node", inst->key}});
    if (!load.present) continue;
    write_figures(out, load.figures, {{"node", inst->key}}, false);
    for (uint32_t r = 0; r < std::min(load.ranks, kMaxMetricRanks); ++r) {
      const discovery::EngineLoad rank = cell.rank(r, now);
      if (rank.present) write_figures(out, rank.figures, {{"node", inst->key}, {"rank", std::to_string(r)}}, true);
    }
  }
  proxy::write_engine_scrape_metrics(out);
}

}  // namespace pdr::router
