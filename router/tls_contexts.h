// TlsContexts: the TLS contexts a topology describes, made at start and remade when a reload
// changes what they are made of (SIGHUP re-reads the certificate files, so a renewed certificate
// is picked up without a restart):
//   listeners.tls / listeners.admin_tls  http::TlsServerContext, swapped into the running server
//                                        (Server::set_tls): new handshakes use it, open
//                                        connections continue with theirs;
//   connectors.tls / an instance's tls   proxy::NodeTlsContexts, published to the proxies;
//   listeners.tls again                  the pinned client context /health_generate uses to
//                                        reach pdrouter's own listener.
// A reload whose files cannot be used (a key that does not match its certificate) keeps the
// contexts in use: logged, and counted in pdrouter_tls_reloads_total{result="failed"}.
//
// Threads: build(), attach() and reload() on the control thread; write_metrics() from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "proto/base/metrics_writer.h"
#include "proto/base/status.h"
#include "discovery/config/topology.h"
#include "router/http/http_server.h"
#include "router/http/tls_server.h"
#include "router/proxy/node_tls.h"

namespace pdr::router {

namespace proxy {
class ProxyService;
}

class TlsContexts {
 public:
  // Makes every context `t` asks for. The error names the setting ("listeners.tls: tls: server key
  // does not match the server certificate"): pdrouter does not start.
  Status build(const config::Topology& t);

  // For ServerOptions::tls before the servers start (null: that listener is plain).
  const std::shared_ptr<const http::TlsServerContext>& client_listener() const { return client_; }
  const std::shared_ptr<const http::TlsServerContext>& admin_listener() const { return admin_; }

  // A proxy service, as soon as it exists (before its server takes requests): gets the node and
  // self contexts now and on every reload.
  void attach_proxy(proxy::ProxyService* proxy);
  // Before the servers' routes are published (/metrics reads them from the workers): where
  // reloaded listener contexts go, whose counters /metrics shows.
  // `admin` may be null (no listeners.admin).
  void attach_servers(http::Server* client, http::Server* admin);

  // After a successful topology reload: remakes the contexts whose settings (or file contents)
  // changed; a failure keeps the old ones.
  void reload(const config::Topology& t);

  void write_metrics(MetricsWriter& out) const;

 private:
  struct Built {
    std::shared_ptr<const http::TlsServerContext> client, admin;
    std::shared_ptr<const proxy::NodeTlsContexts> nodes;
    std::shared_ptr<const http::TlsClientContext> self;
  };
  // Makes what differs from the current settings into *out (the rest copied); false + *error.
  bool make(const config::Topology& t, bool first, Built* out, Status* error) const;
  void publish_to_proxies() const;

  config::ListenerTls client_settings_, admin_settings_;
  std::shared_ptr<const http::TlsServerContext> client_, admin_;
  std::shared_ptr<const proxy::NodeTlsContexts> nodes_;
  std::shared_ptr<const http::TlsClientContext> self_;
  http::Server* client_server_ = nullptr;
  http::Server* admin_server_ = nullptr;
  std::vector<proxy::ProxyService*> proxies_;
  std::atomic<uint64_t> reloads_ok_{0}, reloads_failed_{0};
  std::atomic<int64_t> client_not_after_{0}, admin_not_after_{0};
};

}  // namespace pdr::router
