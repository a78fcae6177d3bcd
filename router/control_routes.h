// The operator-facing endpoints: GET /health, GET /status, GET /metrics. Anything else is 404
// (unknown path) or 405 (known path, wrong method, with an Allow header), both as OpenAI-style
// JSON errors.
//
// handle() runs on HTTP worker threads concurrently; everything it reads is either immutable,
// atomic, or a SnapshotCell, so it takes no lock of its own.
#pragma once

#include <string>

#include "discovery/discovery_counters.h"
#include "discovery/instance.h"
#include "discovery/snapshot_cell.h"
#include "discovery/topology_store.h"
#include "router/http/http_server.h"

namespace pdr::router {

struct ControlContext {
  const discovery::SnapshotCell<discovery::RegistrySnapshot>* registry = nullptr;
  const discovery::DiscoveryCounters* discovery_counters = nullptr;
  const discovery::TopologyStore* topology = nullptr;  // may be null (tests)
  const http::ServerStats* http_stats = nullptr;       // may be null (tests)
  std::string http_listener;       // "127.0.0.1:10001"
  std::string discovery_listener;  // bound ZMQ endpoint
  discovery::Clock::time_point started_at = discovery::Clock::now();
  uint32_t workers = 1;
};

class ControlRoutes {
 public:
  explicit ControlRoutes(ControlContext context) : context_(std::move(context)) {}
  // Answers every request (the router's P/D endpoints will be routed before this later).
  void handle(http::Request&& request, http::ResponseWriter writer) const;

  http::Response health() const;
  http::Response status() const;
  http::Response metrics() const;

 private:
  ControlContext context_;
};

}  // namespace pdr::router
