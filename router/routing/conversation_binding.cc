#include "router/routing/conversation_binding.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace pdr::router::routing {

std::optional<std::string> conversation_binding(const config::Topology::MultiTurn& config,
                                                std::string_view authorization, std::string_view bind_header_value) {
  using BindTo = config::Topology::MultiTurn::BindTo;
  std::string_view credential;
  // The source is part of what is hashed, so equal bytes in an Authorization header and in a
  // tenant header (or in two tenant headers) never make the same binding.
  std::string input = "pdrouter multi-turn binding v1\n";
  input.reserve(input.size() + 16 + config.bind_header.size() + authorization.size() + bind_header_value.size());
  switch (config.bind_to) {
    case BindTo::kNone:
      return std::string();
    case BindTo::kAuthorization:
      credential = authorization;
      input += "authorization\n";
      break;
    case BindTo::kHeader:
      credential = bind_header_value;
      input += "header:";
      input += config.bind_header;
      input += '\n';
      break;
  }
  if (credential.empty()) return std::string();
  input += credential;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  bool ok;
  if (config.binding_secret.empty()) {
    ok = EVP_Digest(input.data(), input.size(), digest, &size, EVP_sha256(), nullptr) == 1;
  } else {
    ok = HMAC(EVP_sha256(), config.binding_secret.data(), static_cast<int>(config.binding_secret.size()),
              reinterpret_cast<const unsigned char*>(input.data()), input.size(), digest, &size) != nullptr;
  }
  // The credential's copy is wiped before the buffer goes back to the allocator.
  OPENSSL_cleanse(input.data(), input.size());
  if (!ok || size != kBindingBytes) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(digest), size);
}

}  // namespace pdr::router::routing
