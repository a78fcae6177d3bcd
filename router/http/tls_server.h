// TLS on pdrouter's own listeners (OpenSSL 3): the server context. Each accepted connection gets a
// TlsSession (router/http/tls_client.h, create_server) driven over memory BIOs by HttpConnection, so the
// libuv read/write path, keep-alive, streaming and back-pressure are those of plain TCP.
//
// TlsServerContext: the certificate chain and key the listener presents, TLS 1.2 minimum, ALPN
// http/1.1 (a client offering ALPN without http/1.1 is refused), no renegotiation, and optionally
// client certificates required and verified against a CA (mutual TLS). Immutable once created,
// shared across threads. A listener swaps in a new one on reload (Server::set_tls): new handshakes
// use it, sessions already made keep the one they started with (OpenSSL counts references).
//
// Handshake failures are classified by TlsHandshakeFailure (the reason label of
// pdrouter_listener_tls_errors_total): the connection is closed, the process never stops.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "proto/base/status.h"

struct ssl_ctx_st;

namespace pdr::http {

class TlsSession;

struct TlsServerOptions {
  // The certificate chain (leaf first, then intermediates, all sent to clients) and its key (PEM).
  std::string cert_pem;
  std::string key_pem;  // a secret: never in a message
  // Set (PEM, one or more CA certificates): every client must present a certificate that
  // verifies against them, or the handshake fails. Empty: no client certificate is asked for.
  std::string client_ca_pem;
};

// Why a listener's TLS connection failed. Names: tls_failure_name().
enum class TlsFailure {
  kPlainHttp,          // plain HTTP sent to the TLS port (answered with a plain-text 400)
  kVersion,            // the client offered only TLS versions below 1.2 (or SSL)
  kClientCertificate,  // mutual TLS: no client certificate, or one that does not verify
  kPeerAlert,          // the client aborted the handshake with an alert (e.g. it does not trust us)
  kAlpn,               // the client offered ALPN protocols, none of them http/1.1
  kTimeout,            // the handshake did not finish within the header read timeout
  kClosed,             // the client closed the connection during the handshake
  kProtocol,           // anything else during the handshake: garbage, malformed messages
  kRecord,             // a TLS error after the handshake (bad record, unexpected message)
  kCount
};
const char* tls_failure_name(TlsFailure failure);
// What a failed handshake step of `session` (a server session) means.
TlsFailure classify_handshake_failure(const TlsSession& session);

class TlsServerContext {
 public:
  // kInvalidValue with a precise message ("tls: cert: no certificate in PEM: ...", "tls: server key
  // does not match the server certificate", "tls: client_ca: no certificate in PEM") if the
  // options cannot be used.
  static Status create(const TlsServerOptions& options, std::shared_ptr<const TlsServerContext>* out);
  ~TlsServerContext();
  TlsServerContext(const TlsServerContext&) = delete;
  TlsServerContext& operator=(const TlsServerContext&) = delete;

  ssl_ctx_st* native() const { return ctx_; }
  bool verifies_clients() const { return verifies_clients_; }
  // The leaf certificate's notAfter, seconds since the Unix epoch (0 if unreadable), and its
  // subject, for /metrics and the log.
  int64_t not_after_unix() const { return not_after_unix_; }
  const std::string& subject() const { return subject_; }

 private:
  TlsServerContext() = default;
  ssl_ctx_st* ctx_ = nullptr;
  bool verifies_clients_ = false;
  int64_t not_after_unix_ = 0;
  std::string subject_;
};

}  // namespace pdr::http
