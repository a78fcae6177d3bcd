// The client key file's parser and digest lookup; the format and the contracts are in
// client_key_file.h.
#include "discovery/config/client_key_file.h"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <map>
#include <utility>

namespace pdr::config {

namespace {

constexpr std::string_view kDigestPrefix = "sha256:";

bool is_space(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (is_space(s.front()) || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (is_space(s.back()) || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "sha256:" followed by exactly 64 hex digits.
bool parse_digest(std::string_view field, KeyDigest* out) {
  if (field.size() != kDigestPrefix.size() + 64 || !field.starts_with(kDigestPrefix)) return false;
  field.remove_prefix(kDigestPrefix.size());
  for (size_t i = 0; i < out->size(); ++i) {
    const int hi = hex_value(field[2 * i]), lo = hex_value(field[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

bool is_key_text(std::string_view key) {
  return std::all_of(key.begin(), key.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

Status line_error(size_t line, std::string_view what) {
  return Status(StatusCode::kInvalidValue, fmt::format("line {}: {}", line, what));
}

}  // namespace

bool is_tenant_name(std::string_view name) {
  if (name.empty() || name.size() > kMaxTenantNameBytes) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
  });
}

KeyDigest digest_of_key(std::string_view key) {
  // Every client request with keys on hashes its key: the algorithm is fetched once (OpenSSL 3's
  // implicit fetch behind EVP_sha256() looks it up, under a lock, on every call; the fetched
  // EVP_MD is immutable and may be shared by threads) and each thread keeps its own digest
  // context (a context is not to be shared). The thread_local is destroyed at thread exit, before
  // OpenSSL's own exit-time cleanup.
  static EVP_MD* const sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  struct Context {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    ~Context() { EVP_MD_CTX_free(ctx); }
  };
  thread_local Context context;
  if (context.ctx == nullptr) context.ctx = EVP_MD_CTX_new();  // a failed allocation is retried
  KeyDigest digest{};
  unsigned int size = 0;
  // These fail only short of memory; the caller then gets the zero digest, which find() and the
  // parser refuse (they never treat it as a key's digest: keys hashed on a failing thread would
  // otherwise all match each other).
  if (sha256 == nullptr || context.ctx == nullptr || EVP_DigestInit_ex2(context.ctx, sha256, nullptr) != 1 ||
      EVP_DigestUpdate(context.ctx, key.data(), key.size()) != 1 ||
      EVP_DigestFinal_ex(context.ctx, digest.data(), &size) != 1) {
    return KeyDigest{};
  }
  return digest;
}

const std::string* ClientKeySet::find(std::string_view presented) const {
  if (presented.empty() || keys.empty()) return nullptr;
  const KeyDigest digest = digest_of_key(presented);
  if (digest == KeyDigest{}) return nullptr;  // hashing failed: matches nothing (digest_of_key)
  auto it = std::lower_bound(keys.begin(), keys.end(), digest,
                             [](const Entry& e, const KeyDigest& d) { return e.digest < d; });
  if (it == keys.end() || CRYPTO_memcmp(it->digest.data(), digest.data(), digest.size()) != 0) return nullptr;
  return &tenants[it->tenant];
}

bool ClientKeySet::operator==(const ClientKeySet& other) const {
  if (tenants != other.tenants || keys.size() != other.keys.size()) return false;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i].digest != other.keys[i].digest || keys[i].tenant != other.keys[i].tenant) return false;
  }
  return true;
}

Status parse_client_key_file(std::string_view text, ClientKeySet* out) {
  struct Parsed {
    KeyDigest digest;
    std::string_view tenant;
    size_t line;
  };
  std::vector<Parsed> parsed;
  size_t line_number = 0;
  while (!text.empty()) {
    ++line_number;
    const size_t end = text.find('\n');
    std::string_view line = trim(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (line.empty() || line.front() == '#') continue;
    // Two fields: the key (or its digest) and the tenant.
    size_t cut = 0;
    while (cut < line.size() && !is_space(line[cut])) ++cut;
    const std::string_view key = line.substr(0, cut);
    std::string_view rest = line.substr(cut);
    while (!rest.empty() && is_space(rest.front())) rest.remove_prefix(1);
    size_t tenant_end = 0;
    while (tenant_end < rest.size() && !is_space(rest[tenant_end])) ++tenant_end;
    const std::string_view tenant = rest.substr(0, tenant_end);
    if (tenant.empty()) return line_error(line_number, "expected '<key> <tenant>' (no tenant after the key)");
    if (tenant_end != rest.size()) return line_error(line_number, "expected '<key> <tenant>' (more than two fields)");
    if (!is_tenant_name(tenant)) {
      return line_error(line_number,
                        fmt::format("the tenant is not a name of 1 to {} of A-Z a-z 0-9 . _ -", kMaxTenantNameBytes));
    }
    if (tenant == kOtherTenant) {
      return line_error(line_number, "the tenant 'other' is reserved (the metrics label of tenants nobody names)");
    }
    Parsed p{{}, tenant, line_number};
    if (key.starts_with(kDigestPrefix)) {
      if (!parse_digest(key, &p.digest)) {
        return line_error(line_number, "a 'sha256:' key must be followed by exactly 64 hex digits");
      }
    } else {
      // Messages never quote the key: a near miss in a file of secrets would leak one.
      if (!is_key_text(key)) return line_error(line_number, "the key holds a byte that is not printable ASCII");
      if (key.size() < kMinClientKeyBytes) {
        return line_error(line_number, fmt::format("the key is shorter than {} characters: a short key can be "
                                                   "guessed (use e.g. openssl rand -hex 24)",
                                                   kMinClientKeyBytes));
      }
      if (key.size() > kMaxClientKeyBytes) {
        return line_error(line_number, fmt::format("the key is longer than {} characters", kMaxClientKeyBytes));
      }
      p.digest = digest_of_key(key);
      if (p.digest == KeyDigest{}) return line_error(line_number, "the key could not be hashed (out of memory)");
    }
    if (parsed.size() >= kMaxClientKeys) {
      return Status(StatusCode::kTooLarge, fmt::format("line {}: more than {} keys", line_number, kMaxClientKeys));
    }
    parsed.push_back(p);
  }
  std::sort(parsed.begin(), parsed.end(), [](const Parsed& a, const Parsed& b) {
    return a.digest != b.digest ? a.digest < b.digest : a.line < b.line;
  });
  ClientKeySet set;
  std::map<std::string_view, uint32_t> tenant_index;
  for (size_t i = 0; i < parsed.size(); ++i) {
    if (i > 0 && parsed[i].digest == parsed[i - 1].digest) {
      return line_error(parsed[i].line, fmt::format("the same key as line {}", parsed[i - 1].line));
    }
    tenant_index.emplace(parsed[i].tenant, 0);
  }
  if (tenant_index.size() > kMaxTenants) {
    return Status(StatusCode::kTooLarge,
                  fmt::format("{} tenants (at most {}: each is a metrics label)", tenant_index.size(), kMaxTenants));
  }
  for (auto& [name, index] : tenant_index) {
    index = static_cast<uint32_t>(set.tenants.size());
    set.tenants.emplace_back(name);
  }
  set.keys.reserve(parsed.size());
  for (const Parsed& p : parsed) set.keys.push_back({p.digest, tenant_index[p.tenant]});
  *out = std::move(set);
  return Status::ok();
}

}  // namespace pdr::config
