// UpstreamPort: how the P/D proxy starts its upstream calls (prefill and decode legs, the Mooncake
// bootstrap /query), as an interface, so that ProxySession's state machine can be driven by a fake
// upstream in unit tests (tests/router/proxy_session_test.cc) instead of only end to end.
//
// Every implementation keeps the contract of http::UpstreamPool::start (router/http/upstream_client.h):
// on_head once, on_body zero or more times, then exactly one of on_complete / on_error (which may
// come before on_head); no callback inside start(); none after cancel(); everything on the
// worker's loop thread. UpstreamCall::failure() is set before on_error fires. A call's callbacks
// (and UpstreamCallbacks::keep_alive) are released together (once it is done or cancelled),
// never while one of them runs.
//
// PoolUpstreamPort is the production implementation: the worker's http::UpstreamPool, whose call
// handles are UpstreamPort::Call themselves (no allocation of its own per call).
#pragma once

#include <memory>

#include "router/http/upstream_client.h"
#include "proto/address.h"
#include "router/routing/node_calls.h"

namespace pdr::router::proxy {

// The start half is routing::NodeCalls (router/routing/node_calls.h): routing starts its own
// calls (the node /tokenize call, the Mooncake bootstrap /query) through the same port.
class UpstreamPort : public routing::NodeCalls {
 public:
  // Handle on one call in flight: http::UpstreamCall's methods that the proxy uses
  // (http::UpstreamCallControl): cancel() closes the connection (how vLLM is told to abort) and
  // suppresses every later callback, no-op once the call is done; pause() / resume() are
  // back-pressure on reading the response; failure() says why the call failed (read in
  // on_error; kNone before); reused_connection(): the call runs on a pooled keep-alive
  // connection (counted in /metrics). The pool's handle is one, so no adapter per call.
  using routing::NodeCalls::Call;
  using routing::NodeCalls::CallPtr;

  // start(): NodeCalls::start. Starts one request to `target`; never calls back synchronously.
  // Never returns null. `request` and `callbacks` are taken by reference and moved from once,
  // where they end up (a leg's four callbacks and keep_alive are moved once, into the call, not
  // once per layer).

  // Shutdown: every call still in flight gets on_error (UpstreamFailure::kPoolClosed) from here.
  virtual void close_all() = 0;
};

class PoolUpstreamPort final : public UpstreamPort {
 public:
  explicit PoolUpstreamPort(http::UpstreamPool& pool) : pool_(pool) {}

  CallPtr start(const proto::HostPort& target, http::UpstreamRequest&& request, http::UpstreamTimeouts timeouts,
                http::UpstreamCallbacks&& callbacks) override;
  void close_all() override { pool_.close_all(); }

 private:
  http::UpstreamPool& pool_;
};

}  // namespace pdr::router::proxy
