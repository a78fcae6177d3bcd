// The P/D router's endpoints that are not a P/D request: GET /v1/models (a decode node's list,
// cached briefly per worker), GET /ready (a compatible pair exists and we are not draining), and
// POST /start_profile, /stop_profile, /reset_prefix_cache (fanned out to every up instance, docs/design/wire-formats.md
// rule 15). Profiling is an admin operation: the caller must have admitted the request
// with AdminRoutes::admit_profile (admin key, body at most kMaxProfileBodyBytes) first. Each node
// gets `Authorization: Bearer <connectors.upstream_api_key>` when one is configured, never the
// client's own Authorization (that is the admin key).
//
// Worker thread only; each function answers through the writer, possibly later.
#pragma once

#include <cstddef>

#include "router/http/http_message.h"
#include "router/http/response_writer.h"
#include "router/proxy/proxy_shared.h"

namespace pdr::router::proxy {

// The largest body POST /start_profile and /stop_profile forward to each node (vLLM's take
// none); a bigger one is refused with 413 (router/admin_routes.cc) rather than copied to every node.
inline constexpr size_t kMaxProfileBodyBytes = 4096;

// 200 + the decode's JSON; 503 when no decode is up; 502/504 when it failed.
void serve_models(WorkerContext& worker, const http::Request& request, http::ResponseWriter writer);
// 200 {"status":"ready","prefill":N,"decode":M} or 503 with why.
void serve_ready(WorkerContext& worker, http::ResponseWriter writer);
// 200 when every instance answered 2xx, else 502; body {"results":[{"instance","role","status",
// "error"}]}. 503 when no instance is up.
void serve_profile(WorkerContext& worker, const http::Request& request, http::ResponseWriter writer);

// upstream_authorization (the Authorization of a call made on a client's behalf):
// router/routing/node_calls.h.

}  // namespace pdr::router::proxy
