#include "router/tls_contexts.h"

#include <string>

#include "proto/base/log.h"
#include "router/proxy/proxy_service.h"

namespace pdr::router {

namespace {

Status make_listener(const config::ListenerTls& settings, const char* key,
                     std::shared_ptr<const http::TlsServerContext>* out) {
  out->reset();
  if (!settings.enabled()) return Status::ok();
  http::TlsServerOptions options;
  options.cert_pem = settings.cert_pem;
  options.key_pem = settings.key_pem;
  options.client_ca_pem = settings.client_ca_pem;
  Status s = http::TlsServerContext::create(options, out);
  return s ? s : Status(s.code(), std::string(key) + ": " + s.message());
}

// The client context that reaches our own listener: its leaf certificate pinned (the first PEM
// block of the chain; the intermediates would also admit every other certificate they issued).
Status make_self(const config::ListenerTls& settings, std::shared_ptr<const http::TlsClientContext>* out) {
  out->reset();
  if (!settings.enabled()) return Status::ok();
  static constexpr std::string_view kEnd = "-----END CERTIFICATE-----";
  const size_t end = settings.cert_pem.find(kEnd);
  http::TlsClientOptions options;
  options.ca_pem = settings.cert_pem.substr(0, end == std::string::npos ? std::string::npos : end + kEnd.size());
  options.pinned = true;
  Status s = http::TlsClientContext::create(options, out);
  return s ? s : Status(s.code(), "listeners.tls (pinned for /health_generate): " + s.message());
}

bool same_nodes(const std::shared_ptr<const proxy::NodeTlsContexts>& built, const config::Topology::Connectors& c) {
  return built && built->settings().tls == c.tls && built->settings().tls_by_node == c.tls_by_node;
}

}  // namespace

bool TlsContexts::make(const config::Topology& t, bool first, Built* out, Status* error) const {
  out->client = client_;
  out->admin = admin_;
  out->nodes = nodes_;
  out->self = self_;
  if (first || t.listeners.tls != client_settings_) {
    if (Status s = make_listener(t.listeners.tls, "listeners.tls", &out->client); !s) {
      *error = s;
      return false;
    }
    if (Status s = make_self(t.listeners.tls, &out->self); !s) {
      *error = s;
      return false;
    }
  }
  if (first || t.listeners.admin_tls != admin_settings_) {
    if (Status s = make_listener(t.listeners.admin_tls, "listeners.admin_tls", &out->admin); !s) {
      *error = s;
      return false;
    }
  }
  if (first || !same_nodes(nodes_, t.connectors)) {
    if (Status s = proxy::NodeTlsContexts::build(t.connectors, &out->nodes); !s) {
      *error = s;
      return false;
    }
  }
  return true;
}

Status TlsContexts::build(const config::Topology& t) {
  Built built;
  Status error;
  if (!make(t, /*first=*/true, &built, &error)) return error;
  client_ = std::move(built.client);
  admin_ = std::move(built.admin);
  nodes_ = std::move(built.nodes);
  self_ = std::move(built.self);
  client_settings_ = t.listeners.tls;
  admin_settings_ = t.listeners.admin_tls;
  client_not_after_.store(client_ ? client_->not_after_unix() : 0, std::memory_order_relaxed);
  admin_not_after_.store(admin_ ? admin_->not_after_unix() : 0, std::memory_order_relaxed);
  if (client_) pdr::log::info("listeners.tls: serving {}", client_->subject());
  if (admin_) {
    pdr::log::info("listeners.admin_tls: serving {}{}", admin_->subject(),
                   admin_->verifies_clients() ? " (client certificates required)" : "");
  }
  return Status::ok();
}

void TlsContexts::attach_proxy(proxy::ProxyService* proxy) {
  proxies_.push_back(proxy);
  proxy->set_tls(nodes_, self_);
}

void TlsContexts::attach_servers(http::Server* client, http::Server* admin) {
  client_server_ = client;
  admin_server_ = admin;
}

void TlsContexts::publish_to_proxies() const {
  for (proxy::ProxyService* p : proxies_) p->set_tls(nodes_, self_);
}

void TlsContexts::reload(const config::Topology& t) {
  const bool changed = t.listeners.tls != client_settings_ || t.listeners.admin_tls != admin_settings_ ||
                       !same_nodes(nodes_, t.connectors);
  if (!changed) return;
  Built built;
  Status error;
  if (!make(t, /*first=*/false, &built, &error)) {
    reloads_failed_.fetch_add(1, std::memory_order_relaxed);
    pdr::log::error("topology reload: TLS settings not applied, the previous ones stay in use: {}", error.message());
    return;
  }
  // A listener started plain stays plain, and one started with TLS keeps TLS (with its last
  // certificate) until a restart (restart_required_changes says so): what /health_generate uses to
  // reach the client listener follows the listener, not the file.
  const bool client_runs_tls = client_server_ != nullptr ? client_server_->tls() != nullptr : built.client != nullptr;
  if (!client_runs_tls) {
    built.self.reset();
  } else if (!built.client) {
    built.client = client_;
    built.self = self_;
  }
  const bool admin_runs_tls = admin_server_ != nullptr && admin_server_->tls() != nullptr;
  if (admin_runs_tls && !built.admin) built.admin = admin_;
  if (built.client && client_server_ != nullptr && client_server_->tls()) {
    if (built.client != client_) pdr::log::info("listeners.tls: new handshakes serve {}", built.client->subject());
    client_server_->set_tls(built.client);
    client_not_after_.store(built.client->not_after_unix(), std::memory_order_relaxed);
  }
  if (built.admin && admin_server_ != nullptr && admin_server_->tls()) {
    if (built.admin != admin_) pdr::log::info("listeners.admin_tls: new handshakes serve {}", built.admin->subject());
    admin_server_->set_tls(built.admin);
    admin_not_after_.store(built.admin->not_after_unix(), std::memory_order_relaxed);
  }
  client_ = std::move(built.client);
  admin_ = std::move(built.admin);
  self_ = std::move(built.self);
  nodes_ = std::move(built.nodes);
  client_settings_ = t.listeners.tls;
  admin_settings_ = t.listeners.admin_tls;
  publish_to_proxies();
  reloads_ok_.fetch_add(1, std::memory_order_relaxed);
}

void TlsContexts::write_metrics(MetricsWriter& out) const {
  auto v = [](const std::atomic<uint64_t>& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  const std::pair<const char*, http::Server*> listeners[] = {{"http", client_server_}, {"admin", admin_server_}};
  for (const auto& [name, server] : listeners) {
    if (server == nullptr && std::string_view(name) == "admin") continue;
    const http::ServerStats* stats = server != nullptr ? &server->stats() : nullptr;
    out.counter("pdrouter_listener_tls_handshakes_total", "TLS handshakes completed on a listener with TLS",
                stats != nullptr ? v(stats->tls_handshakes) : 0.0, {{"listener", name}});
    for (size_t i = 0; i < static_cast<size_t>(http::TlsFailure::kCount); ++i) {
      out.counter("pdrouter_listener_tls_errors_total",
                  "TLS connections a listener closed, by reason: plain_http, version, client_certificate, "
                  "peer_alert, alpn, timeout, closed, protocol (handshake), record (after it)",
                  stats != nullptr ? v(stats->tls_failures[i]) : 0.0,
                  {{"listener", name}, {"reason", http::tls_failure_name(static_cast<http::TlsFailure>(i))}});
    }
    const auto& not_after = std::string_view(name) == "http" ? client_not_after_ : admin_not_after_;
    out.gauge("pdrouter_listener_tls_certificate_expiry_timestamp_seconds",
              "notAfter of the certificate new handshakes get (Unix time; 0 without TLS)",
              static_cast<double>(not_after.load(std::memory_order_relaxed)), {{"listener", name}});
  }
  out.counter("pdrouter_tls_reloads_total",
              "Reloads that changed TLS settings or certificate files, by result (failed: the previous contexts stay)",
              v(reloads_ok_), {{"result", "ok"}});
  out.counter("pdrouter_tls_reloads_total",
              "Reloads that changed TLS settings or certificate files, by result (failed: the previous contexts stay)",
              v(reloads_failed_), {{"result", "failed"}});
}

}  // namespace pdr::router
