// NodeTlsContexts: the TLS client contexts of the legs to nodes, built from a topology's
// connectors.tls and the instances' own tls (discovery/config/topology.h NodeTls), for
// http::UpstreamRequest::tls. Every call to a node's HTTP address (P/D legs, /tokenize, one-node
// relays, fan-outs) takes its node's context from here through WorkerContext::node_tls(); a call
// elsewhere (the Mooncake bootstrap port, pdrouter's own listener) is plain.
//
// Immutable once built; shared by every worker. Rebuilt by router/tls_contexts.h when a reload
// changes the TLS settings (a context per distinct setting: pooled connections are kept per
// context, so an unchanged topology keeps its connections).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "proto/base/status.h"
#include "discovery/config/topology.h"
#include "router/http/tls_client.h"
#include "proto/address.h"

namespace pdr::router::proxy {

class NodeTlsContexts {
 public:
  // kInvalidValue naming the setting ("connectors.tls: tls: ...", "instances 127.0.0.1:8100 tls:
  // ...") when a context cannot be made (a key that does not match its certificate, PEM that
  // OpenSSL cannot read).
  static Status build(const config::Topology::Connectors& connectors, std::shared_ptr<const NodeTlsContexts>* out);

  // The context for the node whose HTTP address is `http_address`; null: plain HTTP.
  const std::shared_ptr<const http::TlsClientContext>& for_node(const proto::HostPort& http_address) const;
  // Any node speaks TLS.
  bool any() const { return any_; }
  // The settings these contexts were built from (to rebuild only on a change).
  const config::Topology::Connectors& settings() const { return settings_; }

 private:
  config::Topology::Connectors settings_;  // only tls and tls_by_node are read
  std::shared_ptr<const http::TlsClientContext> default_;
  std::vector<std::pair<proto::HostPort, std::shared_ptr<const http::TlsClientContext>>> by_node_;
  bool any_ = false;
};

}  // namespace pdr::router::proxy
