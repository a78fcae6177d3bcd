// The admin API: list, add, remove and drain instances over HTTP, plus vLLM's demo-proxy
// POST /instances/add for scripts written against it.
//
//   GET    /admin/instances                   200 {"registry_version", "instances":[...]}
//   POST   /admin/instances                   201 the instance (200 when it took over a node-
//                                             registered entry); body in admin_request.h
//   GET    /admin/instances/{host:port}       200 the instance | 404
//   DELETE /admin/instances/{host:port}       200 the removed instance | 404 | 409 (static)
//   POST   /admin/instances/{host:port}/drain     200 the instance (state "draining") | 404
//   POST   /admin/instances/{host:port}/undrain   200 the instance | 404
//   POST   /instances/add                     the demo proxy's: {"type","instance"} ->
//                                             200 {"message":"Added H:P to prefill_instances."}
// Instances are the same JSON objects as /status shows. {host:port} may be percent-encoded
// ("%5B::1%5D:8000"); it is canonicalised as the registry keys are. Registry semantics (what an
// add over an existing entry does, why static entries cannot be removed, what an operator drain
// survives) are documented in discovery/registry.h.
//
// Authentication: the key is topology admin.api_key (read per request, so a reload applies at
// once), compared in constant time with `Authorization: Bearer <key>` or `X-API-Key: <key>`. No
// key configured -> 403 (the API is disabled; the message says how to enable it); missing or
// wrong key -> 401 (/instances/add: 403 "Forbidden: Invalid API Key.", as the demo proxy).
// Checked before anything else on every /admin path, 404 and 405 included (the route table's
// guard, route_table.h; /instances/add checks its method first, as the demo proxy did). Failed
// authentications are throttled per source address, per network and in all (admin_throttle.h): a
// wrong key from a source out of failure tokens gets 429 "auth_throttled" (Retry-After: 1),
// counted in result "throttled" and in pdrouter_admin_auth_throttled_total; the right key is
// always let in. The same check (admit()) guards
// POST /start_profile, /stop_profile and, with admin.protect_status, GET /status. Errors are
// OpenAI-style JSON: 400 bad body or address, 404, 405 (with Allow; from the route table), 409
// conflict, 413 body over kMaxAdminBodyBytes, 503 when the process has no discovery service or
// server to act through, or the registry is full.
// Demo-proxy compatibility: its 400 messages are kept, and an existing instance is 400
// "Instance already exists." rather than 409; unlike it, pdrouter does not probe the node's
// /v1/models before adding it (nodes prove themselves by heartbeats and requests).
//
// Threads: the endpoints run on HTTP workers, concurrently. Reads answer at once from the worker's
// snapshot. Changes are posted to the discovery thread (the registry's owner); once the snapshot
// showing them is published, the answer is posted back to the request's worker and sent there,
// so a client that gets its 2xx reads the change in /status and the router picks (or skips) the
// instance from then on. The ResponseWriter never leaves its worker: it waits in that worker's
// table of pending answers, and only an id travels through the other threads.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "discovery/discovery_service.h"
#include "discovery/instance.h"
#include "proto/base/log_limiter.h"
#include "discovery/config/topology_store.h"
#include "router/clients/admin_throttle.h"
#include "router/http/http_server.h"

namespace pdr::router {

// The guessing throttle admin keys share with client keys (router/clients/admin_throttle.h).
using clients::AdminThrottle;

// Admin requests by outcome; relaxed atomics, bumped by workers, read by /metrics.
struct AdminCounters {
  enum Result : uint8_t {
    kOk,            // 2xx
    kUnauthorized,  // missing or wrong key
    kDisabled,      // no key configured
    kBadRequest,    // 400, 405, 413
    kNotFound,      // 404
    kConflict,      // 409, and the demo proxy's "Instance already exists."
    kUnavailable,   // 503: no discovery service/server, registry full
    kThrottled,     // 429: too many failed authentications from the address
    kResultCount,
  };
  static std::string_view label(Result r);  // "ok", "unauthorized", ... (metrics label values)

  std::array<std::atomic<uint64_t>, kResultCount> by_result{};
  std::atomic<uint64_t> auth_throttled{0};  // 429s from the throttle (also in by_result)
};

struct AdminContext {
  const config::TopologyStore* topology = nullptr;  // null: no key, API disabled
  discovery::DiscoveryService* discovery = nullptr;    // null (or server null): 503
  http::Server* server = nullptr;
  uint32_t workers = 1;
};

class AdminRoutes {
 public:
  explicit AdminRoutes(AdminContext context);
  // Posted closures point at this object: it must outlive the discovery thread and the server.
  AdminRoutes(const AdminRoutes&) = delete;
  AdminRoutes& operator=(const AdminRoutes&) = delete;

  // The admin key check of /admin/* for another endpoint (profiling, a protected /status): true
  // when the request may proceed; otherwise the 401/403/429 answer (same shapes as /admin/*) is
  // sent on `writer` and counted, and false is returned.
  bool admit(const http::Request& request, http::ResponseWriter& writer) const;
  // admit(), then the body cap of POST /start_profile and /stop_profile (413 body_too_large).
  bool admit_profile(const http::Request& request, http::ResponseWriter& writer) const;

  const AdminCounters& counters() const { return counters_; }

  // An answer and how it counts.
  struct Reply {
    AdminCounters::Result result;
    http::Response response;
  };

  // The endpoints, one per route (router/route_table.cc, which checks the admin key first for
  // every /admin path; /instances/add checks it itself, after its method, answering a wrong key
  // as the demo proxy did). Each runs on worker request.worker (< context.workers); `address`
  // is the {host:port} path segment, `snapshot` that worker's current registry view.
  void list_instances(const http::Request& request, http::ResponseWriter writer,
                      const discovery::RegistrySnapshot& snapshot) const;  // GET /admin/instances
  void add_instance(http::Request&& request, http::ResponseWriter writer) const;  // POST /admin/instances
  void get_instance(const http::Request& request, http::ResponseWriter writer, std::string_view address,
                    const discovery::RegistrySnapshot& snapshot) const;
  void remove_instance(const http::Request& request, http::ResponseWriter writer, std::string_view address) const;
  // POST .../drain (drain true) and .../undrain.
  void set_drain(const http::Request& request, http::ResponseWriter writer, std::string_view address,
                 bool drain) const;
  void seed_add(http::Request&& request, http::ResponseWriter writer) const;  // POST /instances/add
  // 404 for a path under /admin that no route has, counted as not_found.
  void no_route(const http::Request& request, http::ResponseWriter writer) const;

  // Sends `reply` and counts it in pdrouter_admin_requests_total.
  void send(http::ResponseWriter& writer, Reply reply) const;

 private:
  // Turns the registry's outcome into the answer; runs on the request's worker.
  using Answer = std::function<Reply(const discovery::AdminOutcome&)>;
  using Operation = std::function<discovery::AdminOutcome(discovery::Registry&)>;
  enum class Auth : uint8_t { kOk, kDisabled, kUnauthorized, kThrottled };

  // `*throttled_scope` (optional) gets the throttle's scope when the answer is kThrottled.
  Auth authorize(const http::Request& request, AdminThrottle::Scope* throttled_scope = nullptr) const;
  Reply throttled_reply(AdminThrottle::Scope scope) const;  // 429 auth_throttled naming the scope, counted
  using SpecParser = Status (*)(std::string_view body, const config::Topology::Connectors& defaults,
                                config::StaticInstance* out);
  // Parses the body with `parse` (400/413 at once on error), then adds the instance; `answer`
  // gets every outcome (successes are logged here).
  void add_parsed(http::Request&& request, http::ResponseWriter writer, SpecParser parse,
                  Answer answer) const;
  // Parses the {host:port} segment into a registry key; false after answering 400.
  bool instance_key(std::string_view address, http::ResponseWriter& writer, std::string* key) const;
  // Posts a remove or drain and logs it as `what` ("removed", "drained") once done.
  void change_instance(const http::Request& request, http::ResponseWriter writer, std::string what,
                       Operation operation) const;
  // Posts `operation` to the discovery thread; `answer` later runs on the request's worker.
  void change_registry(uint32_t worker, http::ResponseWriter writer, Operation operation,
                       Answer answer) const;
  void finish(uint32_t worker, uint64_t id, const Answer& answer,
              const discovery::AdminOutcome& outcome) const;

  struct WorkerState {  // touched only by its own worker thread
    uint64_t next_id = 0;
    std::unordered_map<uint64_t, http::ResponseWriter> pending;
    LogLimiter auth_log{"admin: failed authentications"};
  };

  AdminContext context_;
  mutable AdminCounters counters_;
  mutable AdminThrottle throttle_;
  mutable std::vector<WorkerState> workers_;
};

}  // namespace pdr::router
