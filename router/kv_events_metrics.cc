#include "router/kv_events_metrics.h"

namespace pdr::router {

void write_kv_events_metrics(MetricsWriter& out, const cache::KvEventsSubscriber* subscriber) {
  const cache::KvEventsNodeStats t = subscriber != nullptr ? subscriber->totals() : cache::KvEventsNodeStats{};
  const cache::BlockIndex::Stats index =
      subscriber != nullptr ? subscriber->index().stats() : cache::BlockIndex::Stats{};
  const size_t nodes = subscriber != nullptr ? subscriber->node_stats().size() : 0;
  auto d = [](uint64_t v) { return static_cast<double>(v); };
  out.gauge("pdrouter_kv_events_nodes", "Nodes whose KV events publisher is subscribed to", d(nodes));
  out.gauge("pdrouter_kv_events_subscribed_ranks", "KV events SUB sockets open (one per node DP rank)",
            d(t.subscribed_ranks));
  out.gauge("pdrouter_kv_events_unsubscribed_ranks",
            "DP ranks of subscribed nodes without a SUB socket (over the caps, or waiting for a retry)",
            d(t.wanted_ranks - t.subscribed_ranks));
  out.counter("pdrouter_kv_events_ranks_over_cap_total",
              "DP ranks not subscribed because dp_size exceeds kv_events.max_ranks_per_node", d(t.ranks_over_cap));
  out.counter("pdrouter_kv_events_rate_limited_total",
              "KV event messages discarded over their node's kv_events.max_node_*_per_sec allowance",
              d(t.rate_limited));
  out.counter("pdrouter_kv_events_batches_total", "KV event batches applied (live and replayed)", d(t.batches));
  out.counter("pdrouter_kv_events_events_total", "KV events in applied batches", d(t.events));
  out.counter("pdrouter_kv_events_gaps_total",
              "Sequence gaps not filled by a replay (the node's index entries were dropped)", d(t.gaps));
  out.counter("pdrouter_kv_events_replays_total", "Sequence gaps filled from the node's replay socket",
              d(t.replays));
  out.counter("pdrouter_kv_events_replay_failures_total",
              "Replays that timed out, broke off or did not cover the gap", d(t.replay_failures));
  out.counter("pdrouter_kv_events_decode_errors_total", "KV event payloads that did not decode",
              d(t.decode_errors));
  out.counter("pdrouter_kv_events_bad_messages_total",
              "KV event messages not shaped [topic, 8-byte seq, payload]", d(t.bad_messages));
  out.counter("pdrouter_kv_events_publisher_restarts_total",
              "Publisher sequence numbers that went backwards (index entries dropped)", d(t.publisher_restarts));
  out.counter("pdrouter_kv_events_node_restarts_total",
              "Node restarts (new epoch in the registry) that dropped index entries", d(t.node_restarts));
  out.gauge("pdrouter_kv_events_index_entries", "(node DP rank, block) entries in the KV block index",
            d(index.entries));
  out.counter("pdrouter_kv_events_blocks_stored_total", "Blocks indexed from BlockStored events",
              d(index.blocks_stored));
  out.counter("pdrouter_kv_events_blocks_removed_total",
              "Index entries removed by BlockRemoved / AllBlocksCleared", d(index.blocks_removed));
  out.counter("pdrouter_kv_events_blocks_evicted_total",
              "Index entries dropped by the kv_events.max_index_entries budget", d(index.blocks_evicted));
  out.counter("pdrouter_kv_events_blocks_skipped_total",
              "Blocks not indexed: unknown parent, bad token or extra-key count, adapter named by id only, "
              "tokenless offload store without a GPU twin",
              d(index.blocks_skipped));
  out.counter("pdrouter_kv_events_blocks_ignored_total",
              "Blocks not indexed by design: KV cache groups other than full attention (sliding window, "
              "Mamba, ...) and tiers other than GPU and node-local CPU",
              d(index.blocks_ignored));
}

void write_prefix_tree_metrics(MetricsWriter& out, const cache::PrefixTree* tree) {
  const cache::PrefixTree::Stats st = tree != nullptr ? tree->stats() : cache::PrefixTree::Stats{};
  out.gauge("pdrouter_prefix_tree_bytes",
            "Memory held by the cache-aware prefix tree: its nodes, node marks and prompt text (budget "
            "policies.cache_aware.prefix_tree_max_bytes)",
            static_cast<double>(st.bytes));
  out.gauge("pdrouter_prefix_tree_nodes", "Nodes of the cache-aware prefix tree", static_cast<double>(st.tree_nodes));
  out.counter("pdrouter_prefix_tree_evictions_total", "Node marks dropped from the prefix tree by its budget",
              static_cast<double>(st.evictions));
}

}  // namespace pdr::router
