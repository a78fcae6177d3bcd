// The client key file (topology client_auth.keys_file): which API keys may use the client
// endpoints, and the tenant each key belongs to. A text file, one key per line:
//
//   # comments and blank lines are ignored
//   <key> <tenant>
//   sha256:<64 hex digits> <tenant>
//
// separated by spaces or tabs. A key is 16 to 1024 printable ASCII characters without spaces; the
// `sha256:` form gives the SHA-256 digest of the key instead (in lower- or upper-case hex; e.g.
// `printf %s "$KEY" | sha256sum`), so the file never needs to hold a key itself. A tenant name is
// 1 to 64 of A-Z a-z 0-9 . _ - (not "other", the metrics label of tenants nobody names). At most
// kMaxClientKeys keys and kMaxTenants distinct tenants; a key listed twice is an error.
//
// Only digests are kept: parse_client_key_file hashes each key as it reads it (the topology
// loader then wipes the file's text), and error messages name a line, never its content. A presented key is
// hashed the same way and looked up by digest; the final comparison of the two digests is
// constant-time (CRYPTO_memcmp). The lookup itself is a binary search over digests, whose
// timing can only tell an attacker about the digest of their own guess.
//
// Pure (no I/O); parse and lookup are thread-safe on distinct / const objects.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"

namespace pdr::config {

inline constexpr size_t kMaxClientKeys = 100'000;
inline constexpr size_t kMaxTenants = 1000;
inline constexpr size_t kMinClientKeyBytes = 16;
inline constexpr size_t kMaxClientKeyBytes = 1024;
inline constexpr size_t kMaxTenantNameBytes = 64;
inline constexpr std::string_view kOtherTenant = "other";
inline constexpr std::string_view kDefaultTenant = "default";

using KeyDigest = std::array<unsigned char, 32>;

// True for 1..kMaxTenantNameBytes of A-Z a-z 0-9 . _ -
bool is_tenant_name(std::string_view name);

// SHA-256 of `key`; all zeros when OpenSSL fails (out of memory), which find() never matches and
// the parser refuses. Any thread.
KeyDigest digest_of_key(std::string_view key);

struct ClientKeySet {
  struct Entry {
    KeyDigest digest;
    uint32_t tenant = 0;  // index into tenants
  };
  std::vector<Entry> keys;           // sorted by digest, no two equal
  std::vector<std::string> tenants;  // distinct names, sorted

  // The tenant of `presented` (a key as a client sent it), or null when no key matches.
  const std::string* find(std::string_view presented) const;
  bool operator==(const ClientKeySet& other) const;
};

// Parses the file's text into *out. Errors (kInvalidValue, kTooLarge) read "line N: what"; *out
// is untouched on error.
Status parse_client_key_file(std::string_view text, ClientKeySet* out);

}  // namespace pdr::config
