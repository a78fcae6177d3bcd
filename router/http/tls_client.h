// TLS for upstream connections (OpenSSL 3): the client side of a TLS session driven over memory
// BIOs, so the libuv read/write path of router/http/upstream_client.cc moves the ciphertext and no socket
// is ever touched by OpenSSL (nothing blocks). The same session type serves pdrouter's own
// listeners (TlsSession::create_server, contexts in router/http/tls_server.h).
//
// TlsClientContext is the configuration shared by every connection of a pool (an SSL_CTX: trust
// anchors, client certificate for mutual TLS, TLS 1.2 minimum, peer verification on). It is
// immutable once created and may be shared across threads.
// TlsSession is one connection's state; it lives on the connection's loop thread.
//
// Errors are Status(kIoError, "tls: ...") with the reason counted process-wide
// (tls_error_count(), exported as pdrouter_upstream_tls_errors_total{reason}). A certificate the
// peer presents that does not verify reads "tls: certificate verify failed: <OpenSSL's reason>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "proto/base/status.h"

// OpenSSL's types, without its headers in ours.
struct ssl_ctx_st;
struct ssl_st;
struct bio_st;

namespace pdr::http {

struct TlsClientOptions {
  // Trusted CA certificates (PEM, one or more). Empty: the system's default store.
  std::string ca_pem;
  // Client certificate chain and its private key (PEM) for mutual TLS; both or neither.
  std::string cert_pem;
  std::string key_pem;  // a secret: never in a message
  // Name sent as SNI and checked against the peer's certificate (DNS name or IP address). Empty:
  // the host of the endpoint each connection goes to.
  std::string server_name;
  // The certificates of ca_pem are the peer's own, not CAs (X509_V_FLAG_PARTIAL_CHAIN: a leaf
  // there verifies itself) and the peer's name is not checked: for a peer whose exact
  // certificate is known (pdrouter probing its own listener over loopback, whose certificate
  // names the public host, not 127.0.0.1).
  bool pinned = false;
};

// Why a TLS connection failed (the label of pdrouter_upstream_tls_errors_total).
enum class TlsErrorReason {
  kVerify,     // the peer's certificate did not verify (unknown CA, expired, name mismatch)
  kHandshake,  // any other handshake failure (protocol version, alert from the peer, not TLS)
  kProtocol,   // a TLS error after the handshake (bad record, unexpected alert)
  kCount
};

const char* tls_error_reason_name(TlsErrorReason reason);
// Process-wide counters, every pool together (relaxed atomics).
uint64_t tls_error_count(TlsErrorReason reason);
void count_tls_error(TlsErrorReason reason);

class TlsClientContext {
 public:
  // kInvalidValue with a precise message ("tls: ca: no certificate in PEM", "tls: client key
  // does not match the certificate", ...) if the options cannot be used.
  static Status create(const TlsClientOptions& options, std::shared_ptr<const TlsClientContext>* out);
  ~TlsClientContext();
  TlsClientContext(const TlsClientContext&) = delete;
  TlsClientContext& operator=(const TlsClientContext&) = delete;

  const std::string& server_name() const { return server_name_; }
  bool pinned() const { return pinned_; }
  ssl_ctx_st* native() const { return ctx_; }

 private:
  TlsClientContext() = default;
  ssl_ctx_st* ctx_ = nullptr;
  std::string server_name_;
  bool pinned_ = false;
};

class TlsSession {
 public:
  enum class Step { kDone, kPending, kFailed };
  enum class Read { kData, kWantMore, kClosed, kFailed };

  // A client session checking the peer against `peer_name` (the context's server_name, if set,
  // wins). kInvalidValue if OpenSSL cannot create it.
  static Status create(const TlsClientContext& context, const std::string& peer_name,
                       std::unique_ptr<TlsSession>* out);
  // A server session on `ctx` (a TlsServerContext's native(), router/http/tls_server.h): it accepts one
  // client; `peer_name` (the client's address) only labels messages. Its failures are not counted
  // in tls_error_count() (the listener counts its own, by reason: failure_reason()).
  static Status create_server(ssl_ctx_st* ctx, const std::string& peer_name, std::unique_ptr<TlsSession>* out);
  ~TlsSession();  // frees the SSL object and both BIOs
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Ciphertext read from the socket (kept whole in the input BIO until consumed).
  void feed(std::string_view ciphertext);
  // Advances the handshake with what was fed. kFailed sets *error (and counts the reason).
  Step handshake(Status* error);
  // Decrypts into `buf`: kData with *n > 0, kWantMore (all fed bytes used), kClosed (the peer
  // sent close_notify), kFailed (*error set, reason counted).
  Read read(std::span<char> buf, size_t* n, Status* error);
  // Encrypts all of `plaintext` (only after the handshake); the ciphertext waits in take_output().
  Status write(std::string_view plaintext);
  // Ciphertext to send (handshake messages, encrypted requests); empty if none.
  bool has_output() const;
  std::string take_output();

  const std::string& peer_name() const { return peer_name_; }
  // After a kFailed step or read: OpenSSL's reason code of the failure (ERR_GET_REASON: e.g.
  // SSL_R_HTTP_REQUEST, SSL_R_UNSUPPORTED_PROTOCOL), 0 if OpenSSL gave none (the stream ended).
  int failure_reason() const { return failure_reason_; }
  // The peer certificate's verification result (X509_V_OK when it verified or none was asked).
  long verify_result() const;
  // Queues a close_notify alert for take_output(); no-op before the handshake is done, after a
  // failure, or the second time.
  void close_notify();

 private:
  TlsSession() = default;
  Status failure(int rc, bool handshaking);

  ssl_st* ssl_ = nullptr;
  bio_st* in_ = nullptr;   // network -> SSL (owned by ssl_)
  bio_st* out_ = nullptr;  // SSL -> network (owned by ssl_)
  std::string peer_name_;
  int failure_reason_ = 0;
  bool server_ = false;
  bool failed_ = false;
};

}  // namespace pdr::http
