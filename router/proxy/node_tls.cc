#include "router/proxy/node_tls.h"

namespace pdr::router::proxy {

namespace {

Status make_context(const config::NodeTls& tls, std::shared_ptr<const http::TlsClientContext>* out) {
  out->reset();
  if (!tls.enabled) return Status::ok();
  http::TlsClientOptions options;
  options.ca_pem = tls.ca_pem;
  options.cert_pem = tls.cert_pem;
  options.key_pem = tls.key_pem;
  options.server_name = tls.server_name;
  return http::TlsClientContext::create(options, out);
}

}  // namespace

Status NodeTlsContexts::build(const config::Topology::Connectors& connectors,
                              std::shared_ptr<const NodeTlsContexts>* out) {
  auto built = std::make_shared<NodeTlsContexts>();
  built->settings_.tls = connectors.tls;
  built->settings_.tls_by_node = connectors.tls_by_node;
  if (Status s = make_context(connectors.tls, &built->default_); !s) {
    return Status(s.code(), "connectors.tls: " + s.message());
  }
  built->any_ = built->default_ != nullptr;
  for (const config::NodeTlsOverride& o : connectors.tls_by_node) {
    std::shared_ptr<const http::TlsClientContext> context;
    // An instance whose settings are the section's shares its context (and pooled connections).
    if (o.tls == connectors.tls) {
      context = built->default_;
    } else if (Status s = make_context(o.tls, &context); !s) {
      return Status(s.code(), "instances " + o.http_address.to_string() + " tls: " + s.message());
    }
    built->any_ = built->any_ || context != nullptr;
    built->by_node_.emplace_back(o.http_address, std::move(context));
  }
  *out = std::move(built);
  return Status::ok();
}

const std::shared_ptr<const http::TlsClientContext>& NodeTlsContexts::for_node(
    const proto::HostPort& http_address) const {
  for (const auto& [address, context] : by_node_) {
    if (address == http_address) return context;
  }
  return default_;
}

}  // namespace pdr::router::proxy
