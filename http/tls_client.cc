#include "http/tls_client.h"

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

namespace pdr::http {

namespace {

std::array<std::atomic<uint64_t>, static_cast<size_t>(TlsErrorReason::kCount)> g_tls_errors{};

// The oldest error on this thread's OpenSSL queue as text; the queue is emptied either way, so a
// stale error never shows up in the next connection's message.
std::string openssl_error(const char* fallback) {
  const unsigned long code = ERR_get_error();
  std::string text = fallback;
  if (code != 0) {
    const char* reason = ERR_reason_error_string(code);
    text = reason != nullptr ? reason : "error " + std::to_string(code);
  }
  ERR_clear_error();
  return text;
}

Status invalid(const std::string& message) { return Status(StatusCode::kInvalidValue, "tls: " + message); }

// A read-only memory BIO over `pem` (freed by the caller).
BIO* pem_bio(std::string_view pem) {
  if (pem.size() > static_cast<size_t>(INT_MAX)) return nullptr;
  return BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
}

Status load_ca(SSL_CTX* ctx, const std::string& pem) {
  if (pem.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx) != 1) return invalid("cannot load the system CA store: " + openssl_error("?"));
    return Status::ok();
  }
  BIO* bio = pem_bio(pem);
  if (bio == nullptr) return invalid("ca: out of memory");
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  int added = 0;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    const int ok = X509_STORE_add_cert(store, cert);
    X509_free(cert);
    if (ok != 1) {
      BIO_free(bio);
      return invalid("ca: cannot add a certificate: " + openssl_error("?"));
    }
    ++added;
  }
  BIO_free(bio);
  ERR_clear_error();  // the read that ended the loop leaves "no start line"
  if (added == 0) return invalid("ca: no certificate in PEM");
  return Status::ok();
}

Status load_client_identity(SSL_CTX* ctx, const std::string& cert_pem, const std::string& key_pem) {
  if (cert_pem.empty() && key_pem.empty()) return Status::ok();
  if (cert_pem.empty() || key_pem.empty()) return invalid("a client certificate needs its key, and a key its certificate");
  BIO* bio = pem_bio(cert_pem);
  if (bio == nullptr) return invalid("cert: out of memory");
  X509* leaf = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  if (leaf == nullptr) {
    BIO_free(bio);
    return invalid("cert: no certificate in PEM: " + openssl_error("?"));
  }
  int rc = SSL_CTX_use_certificate(ctx, leaf);
  X509_free(leaf);
  // Intermediates after the leaf go to the chain sent to the peer.
  while (rc == 1) {
    X509* extra = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
    if (extra == nullptr) break;
    if (SSL_CTX_add0_chain_cert(ctx, extra) != 1) {
      X509_free(extra);
      rc = 0;
    }
  }
  BIO_free(bio);
  ERR_clear_error();
  if (rc != 1) return invalid("cert: cannot use the client certificate");
  bio = pem_bio(key_pem);
  if (bio == nullptr) return invalid("key: out of memory");
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (key == nullptr) {
    ERR_clear_error();  // OpenSSL's text could quote the key's bytes: not in the message
    return invalid("key: no private key in PEM (or it is encrypted)");
  }
  rc = SSL_CTX_use_PrivateKey(ctx, key);
  EVP_PKEY_free(key);
  if (rc != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    return invalid("client key does not match the client certificate");
  }
  return Status::ok();
}

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
  if (context->ctx_ == nullptr) return invalid("cannot create a context: " + openssl_error("?"));
  SSL_CTX* ctx = context->ctx_;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  // Partial writes never happen on a memory BIO; the mode only keeps SSL_write's contract simple.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_RELEASE_BUFFERS);
  if (Status s = load_ca(ctx, options.ca_pem); !s) return s;
  if (Status s = load_client_identity(ctx, options.cert_pem, options.key_pem); !s) return s;
  context->server_name_ = options.server_name;
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
  if (s->ssl_ == nullptr) return invalid("cannot create a session: " + openssl_error("?"));
  s->in_ = BIO_new(BIO_s_mem());
  s->out_ = BIO_new(BIO_s_mem());
  if (s->in_ == nullptr || s->out_ == nullptr) {
    BIO_free(s->in_);
    BIO_free(s->out_);
    s->in_ = s->out_ = nullptr;
    return invalid("cannot create memory BIOs");
  }
  // An empty input BIO means "no bytes yet" (retry), not end of file.
  BIO_set_mem_eof_return(s->in_, -1);
  BIO_set_mem_eof_return(s->out_, -1);
  SSL_set_bio(s->ssl_, s->in_, s->out_);  // ssl_ owns both now
  SSL_set_connect_state(s->ssl_);
  const std::string& name = s->peer_name_;
  if (is_ip_literal(name)) {
    // RFC 6066: no SNI for an address; the certificate must name the address (an IP SAN).
    if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s->ssl_), name.c_str()) != 1) {
      return invalid("cannot check the peer address '" + name + "'");
    }
  } else {
    if (SSL_set_tlsext_host_name(s->ssl_, name.c_str()) != 1 || SSL_set1_host(s->ssl_, name.c_str()) != 1) {
      return invalid("cannot check the peer name '" + name + "'");
    }
  }
  *out = std::move(s);
  return Status::ok();
}

TlsSession::~TlsSession() { SSL_free(ssl_); }  // frees in_ and out_ with it

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
  const int code = SSL_get_error(ssl_, rc);
  const long verify = SSL_get_verify_result(ssl_);
  if (handshaking && verify != X509_V_OK) {
    ERR_clear_error();
    count_tls_error(TlsErrorReason::kVerify);
    return Status(StatusCode::kIoError, std::string("tls: certificate verify failed: ") +
                                            X509_verify_cert_error_string(verify) + " (peer " + peer_name_ + ")");
  }
  const TlsErrorReason reason = handshaking ? TlsErrorReason::kHandshake : TlsErrorReason::kProtocol;
  count_tls_error(reason);
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
