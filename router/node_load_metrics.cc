// The load ledger's /metrics families (contracts in node_load_metrics.h).
#include "router/node_load_metrics.h"

#include <algorithm>
#include <string>

#include "discovery/load_charge.h"

namespace pdr::router {

namespace {

void write_figures(MetricsWriter& out, const discovery::LoadFigures& f, const MetricsWriter::Labels& labels,
                   bool rank) {
  out.gauge(rank ? "pdrouter_node_rank_requests_in_flight" : "pdrouter_node_requests_in_flight",
            "Requests (legs, one-node calls) pdrouter has in flight on the node", f.requests, labels);
  out.gauge(rank ? "pdrouter_node_rank_prefill_tokens_queued" : "pdrouter_node_prefill_tokens_queued",
            "Uncached prompt tokens of prefill legs sent to the node and not yet answered",
            static_cast<double>(f.queued_prefill_tokens), labels);
  out.gauge(rank ? "pdrouter_node_rank_decode_sequences" : "pdrouter_node_decode_sequences",
            "Decode legs running on the node", f.decode_sequences, labels);
  out.gauge(rank ? "pdrouter_node_rank_kv_tokens" : "pdrouter_node_kv_tokens",
            "KV tokens held by the node's decode legs (prompt and streamed tokens, estimated)",
            static_cast<double>(f.kv_tokens), labels);
}

}  // namespace

void write_node_load_metrics(MetricsWriter& out, const discovery::RegistrySnapshot& snapshot,
                             discovery::Clock::time_point now) {
  for (const auto& inst : snapshot.instances) {
    const discovery::InstanceLiveness& live = *inst->liveness;
    write_figures(out, discovery::node_load(live), {{"node", inst->key}}, false);
    const uint32_t ranks =
        std::max(live.ledger.rank_slots(), std::clamp<uint32_t>(inst->dp_size, 1, discovery::kMaxLedgerRanks));
    for (uint32_t r = 0; r < std::min(ranks, kMaxMetricRanks); ++r) {
      write_figures(out, live.ledger.rank(r), {{"node", inst->key}, {"rank", std::to_string(r)}}, true);
    }
    discovery::LoadFigures rest = live.ledger.beyond();
    for (uint32_t r = kMaxMetricRanks; r < ranks; ++r) rest += live.ledger.rank(r);
    if (ranks > kMaxMetricRanks || rest != discovery::LoadFigures{}) {
      write_figures(out, rest, {{"node", inst->key}, {"rank", "rest"}}, true);
    }
    const auto prefill = live.ledger.prefill_tokens_per_second.read(now);
    const auto step = live.ledger.decode_step_seconds.read(now);
    out.gauge("pdrouter_node_prefill_tokens_per_second",
              "Estimated prefill throughput of the node, uncached tokens a second (0: no estimate yet)",
              prefill.value, {{"node", inst->key}});
    out.gauge("pdrouter_node_decode_step_seconds",
              "Estimated time between streamed tokens of the node's decode legs (0: no estimate yet)", step.value,
              {{"node", inst->key}});
    out.counter("pdrouter_node_rate_samples_total", "Samples averaged into the node's rate estimates",
                static_cast<double>(prefill.samples), {{"node", inst->key}, {"estimate", "prefill"}});
    out.counter("pdrouter_node_rate_samples_total", "Samples averaged into the node's rate estimates",
                static_cast<double>(step.samples), {{"node", inst->key}, {"estimate", "decode_step"}});
  }
}

}  // namespace pdr::router
