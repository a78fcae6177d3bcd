// GET /metrics: the pdrouter_kv_events_* families of the KV events subscriber and its block
// index (router/cache/). Totals over every node ever subscribed to (counters never go back);
// per-node numbers are in /status. README.md's metrics reference lists them.
#pragma once

#include "base/metrics_writer.h"
#include "router/cache/kv_events_subscriber.h"

namespace pdr::router {

// `subscriber` null (kv_events.enabled false): every family at 0, so dashboards and alerts see
// the same names either way.
void write_kv_events_metrics(MetricsWriter& out, const cache::KvEventsSubscriber* subscriber);

}  // namespace pdr::router
