#include "router/http/tls_pem.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <climits>

namespace pdr::http::detail {

namespace {

// A read-only memory BIO over `pem` (freed by the caller).
BIO* pem_bio(std::string_view pem) {
  if (pem.size() > static_cast<size_t>(INT_MAX)) return nullptr;
  return BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
}

}  // namespace

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

Status tls_invalid(const std::string& message) { return Status(StatusCode::kInvalidValue, "tls: " + message); }

Status load_trust(SSL_CTX* ctx, const std::string& pem, const char* what) {
  if (pem.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      return tls_invalid("cannot load the system CA store: " + openssl_error("?"));
    }
    return Status::ok();
  }
  BIO* bio = pem_bio(pem);
  if (bio == nullptr) return tls_invalid(std::string(what) + ": out of memory");
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  int added = 0;
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) {
    const int ok = X509_STORE_add_cert(store, cert);
    X509_free(cert);
    if (ok != 1) {
      BIO_free(bio);
      return tls_invalid(std::string(what) + ": cannot add a certificate: " + openssl_error("?"));
    }
    ++added;
  }
  BIO_free(bio);
  ERR_clear_error();  // the read that ended the loop leaves "no start line"
  if (added == 0) return tls_invalid(std::string(what) + ": no certificate in PEM");
  return Status::ok();
}

Status load_identity(SSL_CTX* ctx, const std::string& cert_pem, const std::string& key_pem, const char* what) {
  const std::string who = what;
  BIO* bio = pem_bio(cert_pem);
  if (bio == nullptr) return tls_invalid("cert: out of memory");
  X509* leaf = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  if (leaf == nullptr) {
    BIO_free(bio);
    return tls_invalid("cert: no certificate in PEM: " + openssl_error("?"));
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
  if (rc != 1) return tls_invalid("cert: cannot use the " + who + " certificate");
  bio = pem_bio(key_pem);
  if (bio == nullptr) return tls_invalid("key: out of memory");
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (key == nullptr) {
    ERR_clear_error();  // OpenSSL's text could quote the key's bytes: not in the message
    return tls_invalid("key: no private key in PEM (or it is encrypted)");
  }
  rc = SSL_CTX_use_PrivateKey(ctx, key);
  EVP_PKEY_free(key);
  if (rc != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    return tls_invalid(who + " key does not match the " + who + " certificate");
  }
  return Status::ok();
}

}  // namespace pdr::http::detail
