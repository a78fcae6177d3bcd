#include "router/http/tls_server.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cstring>
#include <ctime>

#include "router/http/tls_client.h"
#include "router/http/tls_pem.h"

namespace pdr::http {

namespace {

// ALPN: http/1.1 is the only protocol served. A client that offers ALPN without it (h2 only) is
// refused with no_application_protocol (RFC 7301 3.2) rather than served a protocol it did not
// ask for; a client offering no ALPN at all is served HTTP/1.1.
int select_alpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned int inlen,
                void*) {
  static const unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, kHttp11, sizeof kHttp11, in, inlen) != OPENSSL_NPN_NEGOTIATED) {
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  *out = selected;
  return SSL_TLSEXT_ERR_OK;
}

int64_t not_after(X509* leaf) {
  const ASN1_TIME* t = leaf != nullptr ? X509_get0_notAfter(leaf) : nullptr;
  std::tm tm{};
  if (t == nullptr || ASN1_TIME_to_tm(t, &tm) != 1) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

std::string subject_of(X509* leaf) {
  if (leaf == nullptr) return {};
  char buf[256] = {};
  X509_NAME_oneline(X509_get_subject_name(leaf), buf, sizeof buf - 1);
  return buf;
}

}  // namespace

const char* tls_failure_name(TlsFailure failure) {
  switch (failure) {
    case TlsFailure::kPlainHttp:
      return "plain_http";
    case TlsFailure::kVersion:
      return "version";
    case TlsFailure::kClientCertificate:
      return "client_certificate";
    case TlsFailure::kPeerAlert:
      return "peer_alert";
    case TlsFailure::kAlpn:
      return "alpn";
    case TlsFailure::kTimeout:
      return "timeout";
    case TlsFailure::kClosed:
      return "closed";
    case TlsFailure::kProtocol:
      return "protocol";
    case TlsFailure::kRecord:
      return "record";
    case TlsFailure::kCount:
      break;
  }
  return "unknown";
}

TlsFailure classify_handshake_failure(const TlsSession& session) {
  const int reason = session.failure_reason();
  switch (reason) {
    case SSL_R_HTTP_REQUEST:
    case SSL_R_HTTPS_PROXY_REQUEST:
      return TlsFailure::kPlainHttp;
    case SSL_R_UNSUPPORTED_PROTOCOL:
    case SSL_R_VERSION_TOO_LOW:
    case SSL_R_NO_PROTOCOLS_AVAILABLE:
    case SSL_R_WRONG_SSL_VERSION:
      return TlsFailure::kVersion;
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
    case SSL_R_CERTIFICATE_VERIFY_FAILED:
      return TlsFailure::kClientCertificate;
    case SSL_R_NO_APPLICATION_PROTOCOL:
    case SSL_R_CALLBACK_FAILED:  // select_alpn refused (OpenSSL reports the callback's refusal so)
      return TlsFailure::kAlpn;
    default:
      break;
  }
  if (session.verify_result() != X509_V_OK) return TlsFailure::kClientCertificate;
  // Alerts received from the peer are reported as SSL_AD_REASON_OFFSET + the alert number.
  if (reason > SSL_AD_REASON_OFFSET) return TlsFailure::kPeerAlert;
  if (reason == 0) return TlsFailure::kClosed;
  return TlsFailure::kProtocol;
}

Status TlsServerContext::create(const TlsServerOptions& options, std::shared_ptr<const TlsServerContext>* out) {
  ERR_clear_error();
  if (options.cert_pem.empty() || options.key_pem.empty()) {
    return detail::tls_invalid("a listener needs a certificate and its key");
  }
  std::shared_ptr<TlsServerContext> context(new TlsServerContext());
  context->ctx_ = SSL_CTX_new(TLS_server_method());
  if (context->ctx_ == nullptr) return detail::tls_invalid("cannot create a context: " + detail::openssl_error("?"));
  SSL_CTX* ctx = context->ctx_;
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // Client-initiated TLS 1.2 renegotiation costs the server a handshake per request of the client's
  // choosing; nothing here needs it. Compression (CRIME) stays off as OpenSSL 3 builds it.
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_NO_COMPRESSION);
  // Idle keep-alive connections give their record buffers back (memory per connection).
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_alpn_select_cb(ctx, &select_alpn, nullptr);
  if (Status s = detail::load_identity(ctx, options.cert_pem, options.key_pem, "server"); !s) return s;
  if (!options.client_ca_pem.empty()) {
    if (Status s = detail::load_trust(ctx, options.client_ca_pem, "client_ca"); !s) return s;
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    // The CAs named in the CertificateRequest, so a client holding several certificates picks one
    // of ours.
    STACK_OF(X509_NAME)* names = sk_X509_NAME_new_null();
    BIO* bio = BIO_new_mem_buf(options.client_ca_pem.data(), static_cast<int>(options.client_ca_pem.size()));
    if (names != nullptr && bio != nullptr) {
      while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
        X509_NAME* name = X509_NAME_dup(X509_get_subject_name(cert));
        if (name != nullptr) sk_X509_NAME_push(names, name);
        X509_free(cert);
      }
      SSL_CTX_set_client_CA_list(ctx, names);  // takes ownership
      names = nullptr;
    }
    sk_X509_NAME_pop_free(names, X509_NAME_free);
    BIO_free(bio);
    ERR_clear_error();
    context->verifies_clients_ = true;
  }
  X509* leaf = SSL_CTX_get0_certificate(ctx);
  context->not_after_unix_ = not_after(leaf);
  context->subject_ = subject_of(leaf);
  *out = std::move(context);
  return Status::ok();
}

TlsServerContext::~TlsServerContext() { SSL_CTX_free(ctx_); }

}  // namespace pdr::http
