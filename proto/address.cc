#include "proto/address.h"

#include <arpa/inet.h>

#include <array>
#include <charconv>
#include <cstring>

#include "proto/base/ascii.h"
#include "proto/quoted_text.h"

namespace pdr::proto {

namespace {

constexpr size_t kMaxDnsNameChars = 253;
constexpr size_t kMaxDnsLabelChars = 63;
constexpr size_t kMaxIpv6Chars = 45;  // INET6_ADDRSTRLEN - 1

Status bad(std::string message) { return Status(StatusCode::kBadAddress, std::move(message)); }

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_hex_digit(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

bool all_of(std::string_view text, bool (*pred)(char)) {
  for (char c : text) {
    if (!pred(c)) return false;
  }
  return true;
}

bool is_ipv4_char(char c) { return is_digit(c) || c == '.'; }
bool is_ipv6_char(char c) { return is_hex_digit(c) || c == ':' || c == '.'; }
bool is_dns_char(char c) { return is_alpha(c) || is_digit(c) || c == '-' || c == '.' || c == '_'; }

Status parse_port(std::string_view text, std::string_view what, uint16_t* port) {
  if (text.empty()) return bad(std::string(what) + " is empty");
  if (!all_of(text, is_digit)) {
    return bad(std::string(what) + " " + quote_untrusted(text) + " is not a number");
  }
  // More than five digits is out of range whatever the value; checking first avoids overflow.
  uint32_t value = 0;
  if (text.size() <= 5) {
    for (char c : text) value = value * 10 + static_cast<uint32_t>(c - '0');
  }
  if (text.size() > 5 || value < 1 || value > 65535) {
    return bad(std::string(what) + " " + quote_untrusted(text) + " is out of range 1..65535");
  }
  *port = static_cast<uint16_t>(value);
  return Status::ok();
}

// Strict dotted quad: four decimal octets 0..255 without leading zeros (which some parsers read
// as octal, so "010.0.0.1" would mean different hosts to different tools).
Status validate_ipv4(std::string_view text) {
  const std::string reason_prefix =
      "host " + quote_untrusted(text) + " is not a valid IPv4 address";
  size_t octets = 0;
  size_t start = 0;
  while (true) {
    const size_t dot = text.find('.', start);
    const std::string_view octet =
        text.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    ++octets;
    if (octets > 4) return bad(reason_prefix + " (more than four octets)");
    if (octet.empty() || octet.size() > 3) return bad(reason_prefix + " (empty or long octet)");
    if (octet.size() > 1 && octet[0] == '0')
      return bad(reason_prefix + " (octet with a leading zero)");
    int value = 0;
    for (char c : octet) value = value * 10 + (c - '0');
    if (value > 255) return bad(reason_prefix + " (octet above 255)");
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  if (octets != 4) return bad(reason_prefix + " (needs four octets)");
  return Status::ok();
}

Status validate_ipv6(std::string_view text) {
  // The character check also rules out NUL bytes, which would end the C string early.
  if (text.empty() || text.size() > kMaxIpv6Chars || !all_of(text, is_ipv6_char)) {
    return bad("host " + quote_untrusted(text) + " is not a valid IPv6 address");
  }
  std::array<char, kMaxIpv6Chars + 1> c_text{};
  std::memcpy(c_text.data(), text.data(), text.size());
  in6_addr parsed{};
  if (inet_pton(AF_INET6, c_text.data(), &parsed) != 1) {
    return bad("host " + quote_untrusted(text) + " is not a valid IPv6 address");
  }
  return Status::ok();
}

Status validate_dns_name(std::string_view text) {
  if (text.size() > kMaxDnsNameChars) {
    return bad("host name is " + std::to_string(text.size()) + " chars, limit 253");
  }
  if (!all_of(text, is_dns_char)) {
    return bad("host " + quote_untrusted(text) +
               " has a character outside letters, digits, '-', '.', '_'");
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t dot = text.find('.', start);
    if (dot == std::string_view::npos) dot = text.size();
    const size_t label_chars = dot - start;
    if (label_chars == 0) return bad("host " + quote_untrusted(text) + " has an empty label");
    if (label_chars > kMaxDnsLabelChars) {
      return bad("host " + quote_untrusted(text) + " has a label longer than 63 chars");
    }
    start = dot + 1;
  }
  return Status::ok();
}


bool is_url_path_char(char c) { return static_cast<unsigned char>(c) > 0x20 && c != 0x7f; }

}  // namespace

std::string HostPort::to_string() const {
  // Built in one buffer (a call per upstream leg: the pool's key and the Host header).
  // Sized exactly: "host:port" usually fits std::string's inline buffer (no allocation).
  const bool v6 = is_ipv6();
  char digits[8];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), port);
  (void)ec;  // a uint16_t always fits
  const size_t n = static_cast<size_t>(end - digits);
  std::string out;
  out.reserve(host.size() + (v6 ? 2 : 0) + 1 + n);
  if (v6) out += '[';
  out += host;
  if (v6) out += ']';
  out += ':';
  out.append(digits, n);
  return out;
}

std::string MoriioZmqAddress::to_string() const {
  return "host:" + host + ",handshake:" + std::to_string(handshake_port) +
         ",notify:" + std::to_string(notify_port);
}

Status parse_host(std::string_view text, std::string* host) {
  if (text.empty()) return bad("host is empty");
  if (text.front() == '[') {
    if (text.size() < 2 || text.back() != ']') return bad("IPv6 host is missing its closing ']'");
    const std::string_view inner = text.substr(1, text.size() - 2);
    if (Status s = validate_ipv6(inner); !s) return s;
    *host = std::string(inner);
    return Status::ok();
  }
  Status valid;
  if (text.find(':') != std::string_view::npos) {
    valid = validate_ipv6(text);
  } else if (all_of(text, is_ipv4_char)) {
    valid = validate_ipv4(text);
  } else {
    valid = validate_dns_name(text);
  }
  if (!valid) return valid;
  *host = std::string(text);
  return Status::ok();
}

Status parse_host_port(std::string_view text, HostPort* out) {
  if (text.empty()) return bad("address is empty");
  if (text.find("://") != std::string_view::npos) {
    return bad("has a URL scheme; expected host:port with no scheme and no path");
  }
  if (text.find('/') != std::string_view::npos) {
    return bad("has a path; expected host:port with no scheme and no path");
  }
  std::string_view host_text;
  std::string_view port_text;
  if (text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("IPv6 host is missing its closing ']'");
    host_text = text.substr(0, close + 1);
    const std::string_view rest = text.substr(close + 1);
    if (rest.empty() || rest.front() != ':') return bad("missing ':port' after the IPv6 host");
    port_text = rest.substr(1);
  } else {
    const size_t colon = text.find(':');
    if (colon == std::string_view::npos) return bad("missing ':port'");
    if (text.rfind(':') != colon) return bad("IPv6 host must be in brackets, as [v6]:port");
    host_text = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  HostPort parsed;
  if (Status s = parse_host(host_text, &parsed.host); !s) return s;
  if (Status s = parse_port(port_text, "port", &parsed.port); !s) return s;
  *out = std::move(parsed);
  return Status::ok();
}

Status parse_http_url(std::string_view text, HttpUrl* out) {
  const size_t scheme_end = text.find("://");
  if (scheme_end == std::string_view::npos) return bad("missing the 'http://' scheme");
  const std::string_view scheme = text.substr(0, scheme_end);
  if (!iequals(scheme, "http")) {
    return bad("scheme " + quote_untrusted(scheme) + " is not supported; expected http://");
  }
  const std::string_view rest = text.substr(scheme_end + 3);
  const size_t slash = rest.find('/');
  const std::string_view authority = rest.substr(0, slash);
  const std::string_view path =
      slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (authority.find('@') != std::string_view::npos) return bad("user info ('@') is not allowed");
  HttpUrl parsed;
  if (Status s = parse_host_port(authority, &parsed.address); !s) return s;
  if (!all_of(path, is_url_path_char)) return bad("path contains a space or control character");
  parsed.path = std::string(path);
  *out = std::move(parsed);
  return Status::ok();
}

Status parse_zmq_tcp_endpoint(std::string_view text, HostPort* out) {
  if (text.empty()) return bad("endpoint is empty");
  const size_t scheme_end = text.find("://");
  if (scheme_end == std::string_view::npos) return bad("missing the 'tcp://' scheme");
  const std::string_view scheme = text.substr(0, scheme_end);
  if (iequals(scheme, "ipc") || iequals(scheme, "inproc")) {
    return bad("scheme " + quote_untrusted(scheme) +
               " names a socket on the router's own host, not the node's; expected tcp://host:port");
  }
  if (!iequals(scheme, "tcp")) {
    return bad("scheme " + quote_untrusted(scheme) + " is not supported; expected tcp://host:port");
  }
  const std::string_view authority = text.substr(scheme_end + 3);
  if (authority.starts_with("*")) {
    return bad("host '*' is the publisher's bind form; give the node's address to connect to");
  }
  HostPort parsed;
  if (Status s = parse_host_port(authority, &parsed); !s) return s;
  if (parsed.host == "0.0.0.0" || parsed.host == "::") {
    return bad("host " + quote_untrusted(parsed.host) +
               " is a wildcard (bind) address; give the node's address to connect to");
  }
  *out = std::move(parsed);
  return Status::ok();
}

std::string zmq_tcp_endpoint(const HostPort& endpoint, uint32_t port_offset) {
  const uint64_t port = uint64_t{endpoint.port} + port_offset;
  if (port > 65535) return {};
  HostPort shifted = endpoint;
  shifted.port = static_cast<uint16_t>(port);
  return "tcp://" + shifted.to_string();
}

std::string zmq_tcp_rank_endpoint(const HostPort& endpoint, std::span<const uint16_t> rank_ports,
                                  uint32_t rank) {
  if (rank_ports.empty()) return zmq_tcp_endpoint(endpoint, rank);
  if (rank >= rank_ports.size()) return {};
  HostPort at = endpoint;
  at.port = rank_ports[rank];
  return zmq_tcp_endpoint(at);
}

Status parse_moriio_zmq_address(std::string_view text, MoriioZmqAddress* out) {
  if (text.empty()) return bad("address is empty");
  MoriioZmqAddress parsed;
  bool has_host = false, has_handshake = false, has_notify = false;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view segment = text.substr(start, comma - start);
    start = comma + 1;
    const size_t colon = segment.find(':');
    if (colon == std::string_view::npos) {
      return bad("segment " + quote_untrusted(segment) + " has no ':' (expected key:value)");
    }
    const std::string_view key = segment.substr(0, colon);
    const std::string_view value = segment.substr(colon + 1);
    bool* seen = key == "host"        ? &has_host
                 : key == "handshake" ? &has_handshake
                 : key == "notify"    ? &has_notify
                                      : nullptr;
    if (seen == nullptr) {
      return bad("unknown key " + quote_untrusted(key) + " (expected host, handshake, notify)");
    }
    if (*seen) return bad("key '" + std::string(key) + "' appears twice");
    Status s = key == "host"        ? parse_host(value, &parsed.host)
               : key == "handshake" ? parse_port(value, "handshake port", &parsed.handshake_port)
                                    : parse_port(value, "notify port", &parsed.notify_port);
    if (!s) return s;
    *seen = true;
  }
  if (!has_host) return bad("missing the 'host' key");
  if (!has_handshake) return bad("missing the 'handshake' key");
  if (!has_notify) return bad("missing the 'notify' key");
  *out = std::move(parsed);
  return Status::ok();
}

namespace {

// 4 or 16 bytes of an IP literal (brackets allowed; IPv4-mapped IPv6 as its IPv4); 0 if none.
size_t literal_bytes(std::string_view host, uint8_t out[16]) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty() || host.size() > kMaxIpv6Chars) return 0;
  char buf[kMaxIpv6Chars + 1];
  std::memcpy(buf, host.data(), host.size());
  buf[host.size()] = '\0';
  if (::inet_pton(AF_INET, buf, out) == 1) return 4;
  if (::inet_pton(AF_INET6, buf, out) != 1) return 0;
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(out, kMapped, sizeof kMapped) == 0) {
    std::memmove(out, out + 12, 4);
    return 4;
  }
  return 16;
}

// The name in lower case without one trailing dot.
std::string folded_name(std::string_view host) {
  std::string out(host);
  for (char& c : out) c = ascii_lower(c);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

}  // namespace

bool names_loopback(std::string_view host) {
  uint8_t bytes[16];
  switch (literal_bytes(host, bytes)) {
    case 4: return bytes[0] == 127;
    case 16: {
      static constexpr uint8_t kLoopback6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
      return std::memcmp(bytes, kLoopback6, 16) == 0;
    }
    default: break;
  }
  const std::string name = folded_name(host);
  return name == "localhost" || (name.size() > 10 && name.ends_with(".localhost"));
}

bool same_host(std::string_view a, std::string_view b) {
  if (names_loopback(a) || names_loopback(b)) return names_loopback(a) && names_loopback(b);
  uint8_t ab[16], bb[16];
  const size_t al = literal_bytes(a, ab);
  const size_t bl = literal_bytes(b, bb);
  if (al != 0 || bl != 0) return al == bl && std::memcmp(ab, bb, al) == 0;
  const std::string fa = folded_name(a);
  return !fa.empty() && fa == folded_name(b);
}

bool side_channel_host_ok(std::string_view named, std::string_view owner_host, std::string_view peer_host) {
  return same_host(named, owner_host) || (names_loopback(named) && same_host(owner_host, peer_host));
}

bool looks_like_moriio_zmq_address(std::string_view text) {
  return text.find("handshake:") != std::string_view::npos || text.starts_with("host:");
}

}  // namespace pdr::proto
