// GET /metrics: the cache families: pdrouter_kv_events_* of the KV events subscriber and its block
// index (router/cache/). Totals over every node ever subscribed to (counters never go back);
// per-node numbers are in /status. docs/metrics.md lists them.
#pragma once

#include "proto/base/metrics_writer.h"
#include "router/cache/kv_events_subscriber.h"
#include "router/cache/prefix_tree.h"

namespace pdr::router {

// `subscriber` null (kv_events.enabled false): every family at 0, so dashboards and alerts see
// the same names either way.
void write_kv_events_metrics(MetricsWriter& out, const cache::KvEventsSubscriber* subscriber);

// The pdrouter_prefix_tree_* families: the text-prompt prefix tree of cache-aware routing
// (router/routing/cache_routing.h). `tree` null: zeros.
void write_prefix_tree_metrics(MetricsWriter& out, const cache::PrefixTree* tree);

}  // namespace pdr::router
