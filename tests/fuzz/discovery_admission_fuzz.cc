// Fuzzes what discovery admission reads from outside: ZAP requests (frames a peer's handshake
// fills: address, mechanism, credential), CURVE key files and CIDRs from a topology.
// Properties: no crash; a ZAP request is admitted only by a listed address or a listed key; a
// parsed key list holds only valid 40-character keys; a parsed CIDR contains its own network; an
// unauthenticated sender may name only an IP literal or loopback (never a host name).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "discovery/config/admission.h"
#include "proto/address.h"
#include "proto/curve_keys.h"
#include "discovery/zap_policy.h"

using namespace pdr;
using namespace pdr::discovery;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // Frames split at NUL bytes, as a peer cannot choose more than the address/credential parts.
  std::vector<std::string> frames;
  size_t start = 0;
  for (size_t i = 0; i <= text.size() && frames.size() < 10; ++i) {
    if (i == text.size() || text[i] == '\0') {
      frames.emplace_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  ZapPolicy policy;
  config::Cidr only;
  if (!config::parse_cidr("127.0.0.7/32", &only)) std::abort();
  policy.allowed_peers.cidrs = {only};
  policy.allowed_client_keys = {"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"};
  const ZapDecision d = decide_zap(policy, frames);
  if (d.allow) {
    const bool by_address = frames.size() > 3 && config::parse_ip_address(frames[3]) &&
                            only.contains(*config::parse_ip_address(frames[3]));
    const bool by_key = frames.size() == 7 && policy.allowed_client_keys.contains(proto::curve_key_z85(frames[6]));
    if (!by_address && !by_key) std::abort();
  }

  std::vector<std::string> keys;
  if (proto::parse_curve_public_keys(text, &keys)) {
    for (const std::string& k : keys) {
      if (k.size() != 40) std::abort();
    }
  }
  proto::CurveKeyPair pair;
  if (proto::parse_curve_secret_key(text, &pair) && pair.public_z85.size() != 40) std::abort();

  config::Cidr c;
  if (size < 128 && config::parse_cidr(text, &c) && !c.contains(c.network)) std::abort();
  // "A node may register only itself": an unauthenticated sender never gets kOwn for a host that
  // is neither loopback nor an IP literal (a name is never resolved), and same_host is symmetric.
  const std::string_view host = text.substr(size / 2);
  const auto peer = config::parse_ip_address(text.substr(0, size / 2));
  const config::AddressCheck check = config::check_registered_address(config::AdmissionClass::kAddress, peer, host);
  if (peer && check == config::AddressCheck::kOwn && !proto::names_loopback(host) && !config::parse_ip_address(host)) {
    std::abort();
  }
  if (proto::same_host(host, text.substr(0, size / 2)) != proto::same_host(text.substr(0, size / 2), host)) {
    std::abort();
  }
  if (!host.empty() && host.size() < 300 && !proto::same_host(host, host) && proto::names_loopback(host)) std::abort();
  return 0;
}
