// GET /metrics: the discovery and HTTP families of pdrouter's own counters (the proxy families
// are in router/proxy/proxy_counters.h and the components' *_counters.h it names, the admin
// family in router/admin_metrics.h), written with proto/base/metrics_writer.h. docs/metrics.md lists
// them all.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/base/metrics_writer.h"
#include "discovery/discovery_counters.h"
#include "discovery/instance.h"
#include "router/http/http_server.h"

namespace pdr::router {

struct TopologyMetrics {
  uint64_t reloads_ok = 0;
  uint64_t reloads_failed = 0;
};

// Appends the discovery families: frames, accepted by format, rejected by reason, hellos,
// goodbyes, added/expired/restarted/revived instances, acks, peer connections, instances by role
// and state (from the snapshot), and topology reloads.
void write_discovery_metrics(MetricsWriter& out, const discovery::DiscoveryCounters& counters,
                             const discovery::RegistrySnapshot& snapshot, const TopologyMetrics& topology);

// Appends the HTTP front-door families: connections, requests, responses by status class, and
// the server's own rejections (400/408/413/431), idle closes, client aborts, handler errors.
void write_http_metrics(MetricsWriter& out, const http::ServerStats& stats);

}  // namespace pdr::router
