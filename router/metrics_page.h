// GET /metrics: Prometheus text exposition (rendered by prometheus-cpp's TextSerializer) of
// pdrouter's own counters. Modules keep plain atomics; this file is the one place that names them
// for Prometheus, so metric names live together and the reference in README.md matches this list.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "discovery/discovery_counters.h"
#include "discovery/instance.h"
#include "router/http/http_server.h"

namespace pdr::router {

// Accumulates metric families in declaration order, then serialises them.
class MetricsWriter {
 public:
  MetricsWriter();
  ~MetricsWriter();
  using Labels = std::vector<std::pair<std::string, std::string>>;
  void counter(std::string_view name, std::string_view help, double value, Labels labels = {});
  void gauge(std::string_view name, std::string_view help, double value, Labels labels = {});
  std::string text() const;

 private:
  struct Families;
  Families* families_;
};

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
