#include "discovery/config/admission.h"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include "proto/address.h"

namespace pdr::config {

std::string_view to_string(AdmissionClass c) {
  switch (c) {
    case AdmissionClass::kOpen: return "open";
    case AdmissionClass::kAddress: return "address";
    case AdmissionClass::kToken: return "token";
    case AdmissionClass::kCurve: return "curve";
    case AdmissionClass::kCount: break;
  }
  return "unknown";
}

bool parse_admission_class(std::string_view text, AdmissionClass* out) {
  for (size_t i = 0; i < kAdmissionClasses; ++i) {
    if (to_string(static_cast<AdmissionClass>(i)) == text) {
      *out = static_cast<AdmissionClass>(i);
      return true;
    }
  }
  return false;
}

bool IpAddress::is_loopback() const {
  if (size == 4) return bytes[0] == 127;
  if (size != 16) return false;
  for (int i = 0; i < 15; ++i) {
    if (bytes[i] != 0) return false;
  }
  return bytes[15] == 1;
}

std::optional<IpAddress> parse_ip_address(std::string_view text) {
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') text = text.substr(1, text.size() - 2);
  if (text.empty() || text.size() > 45) return std::nullopt;
  char buf[64];
  std::memcpy(buf, text.data(), text.size());
  buf[text.size()] = '\0';
  IpAddress a;
  if (::inet_pton(AF_INET, buf, a.bytes.data()) == 1) {
    a.size = 4;
    return a;
  }
  if (::inet_pton(AF_INET6, buf, a.bytes.data()) == 1) {
    static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(a.bytes.data(), kMapped, sizeof kMapped) == 0) {
      std::memmove(a.bytes.data(), a.bytes.data() + 12, 4);
      std::fill(a.bytes.begin() + 4, a.bytes.end(), 0);
      a.size = 4;
    } else {
      a.size = 16;
    }
    return a;
  }
  return std::nullopt;
}

namespace {

bool prefix_equal(const IpAddress& a, const IpAddress& b, uint8_t bits) {
  const size_t whole = bits / 8;
  if (std::memcmp(a.bytes.data(), b.bytes.data(), whole) != 0) return false;
  const uint8_t rest = bits % 8;
  if (rest == 0) return true;
  const uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a.bytes[whole] & mask) == (b.bytes[whole] & mask);
}

std::string address_text(const IpAddress& a) {
  char buf[INET6_ADDRSTRLEN];
  ::inet_ntop(a.size == 4 ? AF_INET : AF_INET6, a.bytes.data(), buf, sizeof buf);
  return buf;
}

}  // namespace

bool Cidr::contains(const IpAddress& a) const {
  if (a.size != network.size) return false;
  return prefix_equal(a, network, prefix_len);
}

std::string Cidr::to_string() const { return fmt::format("{}/{}", address_text(network), prefix_len); }

Status parse_cidr(std::string_view text, Cidr* out) {
  const size_t slash = text.find('/');
  const std::string_view addr_text = text.substr(0, slash);
  auto addr = parse_ip_address(addr_text);
  if (!addr) {
    return Status(StatusCode::kInvalidValue,
                  fmt::format("'{}' is not an IP address or CIDR (e.g. 10.0.0.0/8, fd00::/8)", text));
  }
  const uint8_t max_len = addr->size == 4 ? 32 : 128;
  unsigned len = max_len;
  if (slash != std::string_view::npos) {
    const std::string_view len_text = text.substr(slash + 1);
    auto [end, ec] = std::from_chars(len_text.data(), len_text.data() + len_text.size(), len);
    if (ec != std::errc() || end != len_text.data() + len_text.size() || len_text.empty()) {
      return Status(StatusCode::kInvalidValue, fmt::format("'{}': prefix length is not a number", text));
    }
    if (len > max_len) {
      return Status(StatusCode::kInvalidValue,
                    fmt::format("'{}': prefix length {} is over {}", text, len, max_len));
    }
  }
  Cidr c{*addr, static_cast<uint8_t>(len)};
  // Host bits set is almost always a typo for the network ("10.1.2.3/8"); say so instead of
  // silently widening or narrowing what the operator meant.
  IpAddress masked = *addr;
  for (size_t bit = len; bit < max_len; ++bit) masked.bytes[bit / 8] &= static_cast<uint8_t>(~(0x80 >> (bit % 8)));
  if (!(masked == *addr)) {
    Cidr suggestion{masked, static_cast<uint8_t>(len)};
    return Status(StatusCode::kInvalidValue,
                  fmt::format("'{}' has host bits set: did you mean {}?", text, suggestion.to_string()));
  }
  *out = c;
  return Status::ok();
}

bool AllowList::contains(const IpAddress& a) const {
  return std::any_of(cidrs.begin(), cidrs.end(), [&](const Cidr& c) { return c.contains(a); });
}

bool AllowList::matches_everything() const {
  return std::any_of(cidrs.begin(), cidrs.end(), [](const Cidr& c) { return c.matches_everything(); });
}

AddressCheck check_registered_address(AdmissionClass sender, const std::optional<IpAddress>& peer,
                                      std::string_view host) {
  if (authenticated(sender) || !peer) return AddressCheck::kOwn;
  if (proto::names_loopback(host)) return peer->is_loopback() ? AddressCheck::kOwn : AddressCheck::kNotOwn;
  const auto registered = parse_ip_address(host);
  if (!registered) return AddressCheck::kHostName;
  return *registered == *peer ? AddressCheck::kOwn : AddressCheck::kNotOwn;
}

std::optional<ForeignAddress> find_foreign_address(AdmissionClass sender, const std::optional<IpAddress>& peer,
                                                   const proto::Registration& reg) {
  const std::pair<std::string_view, const std::string*> named[] = {
      {"http_address", &reg.http_address.host},
      {"zmq_address", reg.moriio_zmq ? &reg.moriio_zmq->host : nullptr},
      {"zmq_address", reg.kv_address ? &reg.kv_address->host : nullptr},
      {"kv_events_endpoint", reg.kv_events_endpoint ? &reg.kv_events_endpoint->host : nullptr},
      {"kv_events_replay_endpoint", reg.kv_events_replay_endpoint ? &reg.kv_events_replay_endpoint->host : nullptr},
  };
  for (const auto& [field, host] : named) {
    if (host == nullptr) continue;
    const AddressCheck check = check_registered_address(sender, peer, *host);
    if (check != AddressCheck::kOwn) return ForeignAddress{field, *host, check};
  }
  return std::nullopt;
}

}  // namespace pdr::config
