// NodeCalls: how routing starts its own HTTP calls to a node (the /tokenize call of
// cache_tokenize.h, the Mooncake bootstrap /query of mooncake_cache.h), as an interface, so that
// routing/ needs nothing of the proxy that carries requests. The proxy's UpstreamPort
// (router/proxy/upstream_port.h), which also starts the prefill and decode legs, derives from it:
// one port per worker, one fake in tests for both.
//
// The contract is http::UpstreamPool::start's (router/http/upstream_client.h), as UpstreamPort
// states it: on_head once, on_body zero or more times, then exactly one of on_complete /
// on_error; no callback inside start(); none after cancel(); everything on the worker's loop.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "discovery/config/topology.h"
#include "proto/address.h"
#include "router/http/upstream_client.h"

namespace pdr::router::routing {

class NodeCalls {
 public:
  // Handle on one call in flight (http::UpstreamCallControl: cancel, pause/resume, failure()).
  using Call = http::UpstreamCallControl;
  using CallPtr = std::shared_ptr<Call>;

  virtual ~NodeCalls() = default;
  // Starts one request to `target`; never calls back synchronously. Never returns null.
  // `request` and `callbacks` are taken by reference and moved from once, where they end up.
  virtual CallPtr start(const proto::HostPort& target, http::UpstreamRequest&& request,
                        http::UpstreamTimeouts timeouts, http::UpstreamCallbacks&& callbacks) = 0;
};

// The Authorization value for an upstream call made on a client's behalf to an endpoint pdrouter
// routes itself: the client's own, else "Bearer <connectors.upstream_api_key>", else empty. Never
// for a pass-through path (router/proxy/one_node_relay.h), which carries the client's own only.
std::string upstream_authorization(const config::Topology& topology, std::string_view client_value);

}  // namespace pdr::router::routing
