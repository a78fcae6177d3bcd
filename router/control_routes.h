// The operator-facing endpoints: GET /health, GET /status, GET /metrics, and the admin API
// (/admin/..., POST /instances/add; see admin_routes.h). Anything else is 404
// (unknown path) or 405 (known path, wrong method, with an Allow header), both as OpenAI-style
// JSON errors.
//
// handle() runs on HTTP worker threads concurrently. Each worker reads the registry through its
// own SnapshotReader (indexed by Request::worker), so the steady-state read is one atomic load and
// no lock; everything else it reads is immutable or atomic.
#pragma once

#include <string>
#include <vector>

#include "discovery/discovery_counters.h"
#include "discovery/discovery_service.h"
#include "discovery/instance.h"
#include "discovery/snapshot_cell.h"
#include "discovery/topology_store.h"
#include "router/admin_routes.h"
#include "router/http/http_server.h"
#include "router/proxy/proxy_counters.h"

namespace pdr::router {

struct ControlContext {
  const discovery::SnapshotCell<discovery::RegistrySnapshot>* registry = nullptr;
  const discovery::DiscoveryCounters* discovery_counters = nullptr;
  const discovery::TopologyStore* topology = nullptr;  // may be null (tests)
  const http::ServerStats* http_stats = nullptr;       // may be null (tests)
  const proxy::ProxyCounters* proxy_counters = nullptr;  // may be null (tests)
  // For the admin API: registry changes go to the discovery thread, answers come back to the
  // request's worker through the server. Both may be null (tests without an admin API).
  discovery::DiscoveryService* discovery = nullptr;
  http::Server* server = nullptr;
  std::string http_listener;       // "127.0.0.1:10001"
  std::string discovery_listener;  // bound ZMQ endpoint
  std::string discovery_curve_listener;  // bound CURVE endpoint, "" if none
  bool discovery_open = false;     // discovery admits any address from the network (allow_open)
  discovery::Clock::time_point started_at = discovery::Clock::now();
  uint32_t workers = 1;
};

class ControlRoutes {
 public:
  explicit ControlRoutes(ControlContext context);
  // Answers every request (the router's P/D endpoints will be routed before this later).
  // request.worker must be < context.workers.
  void handle(http::Request&& request, http::ResponseWriter writer) const;

  http::Response health(uint32_t worker) const;
  http::Response status(uint32_t worker) const;
  http::Response metrics(uint32_t worker) const;

 private:
  const discovery::RegistrySnapshot& registry(uint32_t worker) const;

  ControlContext context_;
  AdminRoutes admin_;
  // One per worker; a worker only ever touches its own (hence mutable behind const handle()).
  mutable std::vector<discovery::SnapshotReader<discovery::RegistrySnapshot>> readers_;
};

}  // namespace pdr::router
