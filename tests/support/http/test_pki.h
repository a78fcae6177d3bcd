// A throwaway PKI made with OpenSSL's API for the TLS unit tests of router/http/ (header only; the tests
// link OpenSSL through pdr_http): a CA, certificates it signs (or self-signed ones), as PEM.
#pragma once

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>
#include <string>

namespace pdr::test {

struct PkiKeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct PkiCertFree {
  void operator()(X509* c) const { X509_free(c); }
};

struct PkiIdentity {
  std::unique_ptr<EVP_PKEY, PkiKeyFree> key;
  std::unique_ptr<X509, PkiCertFree> cert;
};

// A certificate for `cn` with subjectAltName `san` (empty: none), valid from now+from_days to
// now+to_days, signed by `issuer` (null: self-signed); a CA when `ca`.
inline PkiIdentity make_identity(const char* cn, const std::string& san, long from_days, long to_days,
                                 const PkiIdentity* issuer, bool ca) {
  static long serial = 1000;
  PkiIdentity id;
  id.key.reset(EVP_EC_gen("P-256"));
  id.cert.reset(X509_new());
  X509* c = id.cert.get();
  X509_set_version(c, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(c), serial++);
  X509_gmtime_adj(X509_getm_notBefore(c), from_days * 86400);
  X509_gmtime_adj(X509_getm_notAfter(c), to_days * 86400);
  X509_set_pubkey(c, id.key.get());
  X509_NAME_add_entry_by_txt(X509_get_subject_name(c), "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn),
                             -1, -1, 0);
  X509* issuer_cert = issuer != nullptr ? issuer->cert.get() : c;
  EVP_PKEY* issuer_key = issuer != nullptr ? issuer->key.get() : id.key.get();
  X509_set_issuer_name(c, X509_get_subject_name(issuer_cert));
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer_cert, c, nullptr, nullptr, 0);
  auto add = [&](int nid, const char* value) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (ext != nullptr) {
      X509_add_ext(c, ext, -1);
      X509_EXTENSION_free(ext);
    }
  };
  add(NID_basic_constraints, ca ? "critical,CA:TRUE" : "CA:FALSE");
  if (ca) add(NID_key_usage, "critical,keyCertSign,cRLSign");
  if (!san.empty()) add(NID_subject_alt_name, san.c_str());
  X509_sign(c, issuer_key, EVP_sha256());
  return id;
}

inline std::string bio_text(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string text(data, static_cast<size_t>(n));
  BIO_free(bio);
  return text;
}

inline std::string cert_pem(const PkiIdentity& id) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, id.cert.get());
  return bio_text(bio);
}

inline std::string key_pem(const PkiIdentity& id) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, id.key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  return bio_text(bio);
}

}  // namespace pdr::test
