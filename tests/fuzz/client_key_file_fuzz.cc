// Fuzzes discovery/config/client_key_file: the client key file is operator input, but a hand-written parser
// of a file of secrets must never crash, never accept a line it cannot account for, and never
// quote a key in an error. Properties: a parsed set holds sorted, distinct digests whose tenant
// indices are in range and name valid tenants; written back as "sha256:<hex> <tenant>" lines it
// parses to the same set; an error names a line (or a count) and holds no byte of the input
// beyond what its fixed text and numbers spell.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "discovery/config/client_key_file.h"

namespace {

std::string hex(const pdr::config::KeyDigest& d) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : d) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdr::config;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ClientKeySet set;
  const pdr::Status st = parse_client_key_file(text, &set);
  if (!st.is_ok()) {
    if (!set.keys.empty() || !set.tenants.empty()) std::abort();  // untouched on error
    const std::string& m = st.message();
    if (!(m.starts_with("line ") || m.find("tenants") != std::string::npos)) std::abort();
    // The messages are fixed text and numbers: no quote of a key or tenant.
    if (m.find('\'') != std::string::npos && m.find("'<key> <tenant>'") == std::string::npos &&
        m.find("'sha256:'") == std::string::npos && m.find("'other'") == std::string::npos) {
      std::abort();
    }
    return 0;
  }
  if (set.tenants.size() > kMaxTenants || set.keys.size() > kMaxClientKeys) std::abort();
  for (size_t i = 0; i < set.tenants.size(); ++i) {
    if (!is_tenant_name(set.tenants[i]) || set.tenants[i] == kOtherTenant) std::abort();
    if (i > 0 && !(set.tenants[i - 1] < set.tenants[i])) std::abort();
  }
  std::string again;
  for (size_t i = 0; i < set.keys.size(); ++i) {
    if (set.keys[i].tenant >= set.tenants.size()) std::abort();
    if (i > 0 && !(set.keys[i - 1].digest < set.keys[i].digest)) std::abort();
    again += "sha256:" + hex(set.keys[i].digest) + " " + set.tenants[set.keys[i].tenant] + "\n";
  }
  ClientKeySet round_trip;
  if (!parse_client_key_file(again, &round_trip).is_ok() || !(round_trip == set)) std::abort();
  // A presented key is found only if its digest is listed.
  ClientKeySet::Entry probe{digest_of_key(text.substr(0, 64)), 0};
  const std::string* tenant = set.find(text.substr(0, 64));
  bool listed = false;
  for (const auto& e : set.keys) listed = listed || e.digest == probe.digest;
  if ((tenant != nullptr) != (listed && !text.substr(0, 64).empty())) std::abort();
  return 0;
}
