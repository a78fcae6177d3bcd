#include "router/http/tls_client.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>

#include "router/http/tls_pem.h"

namespace pdr::http {

namespace {

using detail::openssl_error;
using detail::tls_invalid;

std::array<std::atomic<uint64_t>, static_cast<size_t>(TlsErrorReason::kCount)> g_tls_errors{};

bool is_ip_literal(const std::string& name) {
  ASN1_OCTET_STRING* ip = a2i_IPADDRESS(name.c_str());
  if (ip == nullptr) {
    ERR_clear_error();
    return false;
  }
  ASN1_OCTET_STRING_free(ip);
  return true;
}

}  // namespace

const char* tls_error_reason_name(TlsErrorReason reason) {
  switch (reason) {
    case TlsErrorReason::kVerify:
      return "verify";
    case TlsErrorReason::kHandshake:
      return "handshake";
    case TlsErrorReason::kProtocol:
      return "protocol";
    case TlsErrorReason::kCount:
      break;
  }
  return "unknown";
}

uint64_t tls_error_count(TlsErrorReason reason) {
  return g_tls_errors[static_cast<size_t>(reason)].load(std::memory_order_relaxed);
}

void count_tls_error(TlsErrorReason reason) {
  g_tls_errors[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
}

// ---------------------------------------------------------------------------------------------
// TlsClientContext

Status TlsClientContext::create(const TlsClientOptions& options, std::shared_ptr<const TlsClientContext>* out) {
  ERR_clear_error();
  std::shared_ptr<TlsClientContext> context(new TlsClientContext());
  context->ctx_ = SSL_CTX_new(TLS_client_method());
  if (context->ctx_ == nullptr) return tls_invalid("cannot create a context: " + openssl_error("?"));
  SSL_CTX* ctx = context->ctx_;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  // Partial writes never happen on a memory BIO; the mode only keeps SSL_write's contract simple.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_RELEASE_BUFFERS);
  if (Status s = detail::load_trust(ctx, options.ca_pem, "ca"); !s) return s;
  if (!options.cert_pem.empty() || !options.key_pem.empty()) {
    if (options.cert_pem.empty() || options.key_pem.empty()) {
      return tls_invalid("a client certificate needs its key, and a key its certificate");
    }
    if (Status s = detail::load_identity(ctx, options.cert_pem, options.key_pem, "client"); !s) return s;
  }
  context->server_name_ = options.server_name;
  if (options.pinned) {
    if (options.ca_pem.empty()) return tls_invalid("a pinned peer needs its certificate");
    X509_VERIFY_PARAM_set_flags(SSL_CTX_get0_param(ctx), X509_V_FLAG_PARTIAL_CHAIN);
    context->pinned_ = true;
  }
  *out = std::move(context);
  return Status::ok();
}

TlsClientContext::~TlsClientContext() { SSL_CTX_free(ctx_); }

// ---------------------------------------------------------------------------------------------
// TlsSession

Status TlsSession::create(const TlsClientContext& context, const std::string& peer_name,
                          std::unique_ptr<TlsSession>* out) {
  ERR_clear_error();
  std::unique_ptr<TlsSession> s(new TlsSession());
  s->peer_name_ = context.server_name().empty() ? peer_name : context.server_name();
  s->ssl_ = SSL_new(context.native());
  if (s->ssl_ == nullptr) return tls_invalid("cannot create a session: " + openssl_error("?"));
  s->in_ = BIO_new(BIO_s_mem());
  s->out_ = BIO_new(BIO_s_mem());
  if (s->in_ == nullptr || s->out_ == nullptr) {
    BIO_free(s->in_);
    BIO_free(s->out_);
    s->in_ = s->out_ = nullptr;
    return tls_invalid("cannot create memory BIOs");
  }
  // An empty input BIO means "no bytes yet" (retry), not end of file.
  BIO_set_mem_eof_return(s->in_, -1);
  BIO_set_mem_eof_return(s->out_, -1);
  SSL_set_bio(s->ssl_, s->in_, s->out_);  // ssl_ owns both now
  SSL_set_connect_state(s->ssl_);
  const std::string& name = s->peer_name_;
  if (context.pinned()) {
    // The certificate itself is trusted (TlsClientOptions::pinned): no name to check.
  } else if (is_ip_literal(name)) {
    // RFC 6066: no SNI for an address; the certificate must name the address (an IP SAN).
    if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s->ssl_), name.c_str()) != 1) {
      return tls_invalid("cannot check the peer address '" + name + "'");
    }
  } else {
    if (SSL_set_tlsext_host_name(s->ssl_, name.c_str()) != 1 || SSL_set1_host(s->ssl_, name.c_str()) != 1) {
      return tls_invalid("cannot check the peer name '" + name + "'");
    }
  }
  *out = std::move(s);
  return Status::ok();
}

Status TlsSession::create_server(ssl_ctx_st* ctx, const std::string& peer_name, std::unique_ptr<TlsSession>* out) {
  ERR_clear_error();
  std::unique_ptr<TlsSession> s(new TlsSession());
  s->peer_name_ = peer_name;
  s->server_ = true;
  s->ssl_ = SSL_new(ctx);  // holds its own reference on ctx: a reloaded context frees the old one later
  if (s->ssl_ == nullptr) return tls_invalid("cannot create a session: " + openssl_error("?"));
  s->in_ = BIO_new(BIO_s_mem());
  s->out_ = BIO_new(BIO_s_mem());
  if (s->in_ == nullptr || s->out_ == nullptr) {
    BIO_free(s->in_);
    BIO_free(s->out_);
    s->in_ = s->out_ = nullptr;
    return tls_invalid("cannot create memory BIOs");
  }
  BIO_set_mem_eof_return(s->in_, -1);
  BIO_set_mem_eof_return(s->out_, -1);
  SSL_set_bio(s->ssl_, s->in_, s->out_);
  SSL_set_accept_state(s->ssl_);
  *out = std::move(s);
  return Status::ok();
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

long TlsSession::verify_result() const { return SSL_get_verify_result(ssl_); }

void TlsSession::close_notify() {
  if (failed_ || SSL_is_init_finished(ssl_) != 1 || (SSL_get_shutdown(ssl_) & SSL_SENT_SHUTDOWN) != 0) return;
  ERR_clear_error();
  SSL_shutdown(ssl_);  // writes the alert to the output BIO; the peer's answer is not awaited
  ERR_clear_error();
}  // frees in_ and out_ with it

void TlsSession::feed(std::string_view ciphertext) {
  // A memory BIO takes everything (it grows); the caller feeds at most one socket read at a time
  // and drains it with read() before the next.
  while (!ciphertext.empty()) {
    const int chunk = static_cast<int>(std::min<size_t>(ciphertext.size(), INT_MAX));
    const int n = BIO_write(in_, ciphertext.data(), chunk);
    if (n <= 0) return;
    ciphertext.remove_prefix(static_cast<size_t>(n));
  }
}

Status TlsSession::failure(int rc, bool handshaking) {
  failed_ = true;
  const int code = SSL_get_error(ssl_, rc);
  failure_reason_ = ERR_GET_REASON(ERR_peek_error());
  const long verify = SSL_get_verify_result(ssl_);
  if (handshaking && verify != X509_V_OK) {
    ERR_clear_error();
    if (!server_) count_tls_error(TlsErrorReason::kVerify);
    return Status(StatusCode::kIoError, std::string("tls: certificate verify failed: ") +
                                            X509_verify_cert_error_string(verify) + " (peer " + peer_name_ + ")");
  }
  const TlsErrorReason reason = handshaking ? TlsErrorReason::kHandshake : TlsErrorReason::kProtocol;
  if (!server_) count_tls_error(reason);
  std::string what = code == SSL_ERROR_SSL ? openssl_error("protocol error") : openssl_error("unexpected end of stream");
  return Status(StatusCode::kIoError,
                std::string("tls: ") + (handshaking ? "handshake failed: " : "") + what + " (peer " + peer_name_ + ")");
}

TlsSession::Step TlsSession::handshake(Status* error) {
  ERR_clear_error();
  const int rc = SSL_do_handshake(ssl_);
  if (rc == 1) return Step::kDone;
  const int code = SSL_get_error(ssl_, rc);
  if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) return Step::kPending;
  *error = failure(rc, /*handshaking=*/true);
  return Step::kFailed;
}

TlsSession::Read TlsSession::read(std::span<char> buf, size_t* n, Status* error) {
  *n = 0;
  ERR_clear_error();
  size_t got = 0;
  const int rc = SSL_read_ex(ssl_, buf.data(), buf.size(), &got);
  if (rc == 1) {
    *n = got;
    return Read::kData;
  }
  const int code = SSL_get_error(ssl_, rc);
  if (code == SSL_ERROR_WANT_READ || code == SSL_ERROR_WANT_WRITE) return Read::kWantMore;
  if (code == SSL_ERROR_ZERO_RETURN) return Read::kClosed;
  *error = failure(rc, /*handshaking=*/false);
  return Read::kFailed;
}

Status TlsSession::write(std::string_view plaintext) {
  ERR_clear_error();
  while (!plaintext.empty()) {
    size_t written = 0;
    const int rc = SSL_write_ex(ssl_, plaintext.data(), plaintext.size(), &written);
    if (rc != 1) return failure(rc, /*handshaking=*/false);
    plaintext.remove_prefix(written);
  }
  return Status::ok();
}

bool TlsSession::has_output() const { return BIO_ctrl_pending(out_) > 0; }

std::string TlsSession::take_output() {
  std::string bytes;
  const size_t pending = BIO_ctrl_pending(out_);
  if (pending == 0) return bytes;
  bytes.resize(pending);
  const int n = BIO_read(out_, bytes.data(), static_cast<int>(std::min<size_t>(pending, INT_MAX)));
  bytes.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return bytes;
}

}  // namespace pdr::http
