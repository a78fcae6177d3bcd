// PEM loading shared by the TLS client and server contexts (internal to router/http/; OpenSSL 3).
// Messages never quote a key's bytes: OpenSSL's text for a bad key is dropped.
#pragma once

#include <string>
#include <string_view>

#include "proto/base/status.h"

struct ssl_ctx_st;

namespace pdr::http::detail {

// The oldest error on this thread's OpenSSL queue as text (`fallback` if none); the queue is
// emptied either way, so a stale error never shows up in the next connection's message.
std::string openssl_error(const char* fallback);

// Status(kInvalidValue, "tls: " + message).
Status tls_invalid(const std::string& message);

// Adds every certificate of `pem` to the context's trust store ("tls: <what>: no certificate in
// PEM" when it holds none). Empty `pem`: the system's default store.
Status load_trust(ssl_ctx_st* ctx, const std::string& pem, const char* what);

// The context's own certificate chain (leaf first, then intermediates, all sent to the peer) and
// its private key; `who` ("client", "server") names them in messages ("tls: client key does not
// match the client certificate").
Status load_identity(ssl_ctx_st* ctx, const std::string& cert_pem, const std::string& key_pem, const char* who);

}  // namespace pdr::http::detail
