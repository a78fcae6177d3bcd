// Reasons behind the listener address checks; contracts are in topology_addresses.h.
#include "discovery/config/topology_addresses.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>

#include "discovery/config/topology.h"
#include "discovery/config/yaml_reader.h"

namespace pdr::config {

using yaml::quoted_excerpt;

namespace {

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Port text to a number; text longer than 6 digits is out of range anyway.
bool parse_port_number(std::string_view text, uint64_t* out) {
  if (!all_digits(text)) return false;
  if (text.size() > 6) {
    *out = 999999;
    return true;
  }
  std::from_chars(text.data(), text.data() + text.size(), *out);
  return true;
}

}  // namespace

Status parse_listen_address(std::string_view text, proto::HostPort* out) {
  size_t colon = text.rfind(':');
  uint64_t port = 0;
  if (colon != std::string_view::npos && parse_port_number(text.substr(colon + 1), &port)) {
    if (port > 65535) {
      return Status(StatusCode::kOutOfRange,
                    fmt::format("port {} is out of range (1..65535, or 0 for an ephemeral port)",
                                text.substr(colon + 1)));
    }
    if (port == 0) {
      // parse_host_port rejects port 0, so validate the host with a stand-in port.
      std::string with_port = std::string(text.substr(0, colon)) + ":1";
      Status s = proto::parse_host_port(with_port, out);
      if (s) out->port = 0;
      return s;
    }
  }
  return proto::parse_host_port(text, out);
}

Status validate_zmq_endpoint(std::string_view text) {
  constexpr std::string_view kTcp = "tcp://";
  constexpr std::string_view kIpc = "ipc://";
  if (text.starts_with(kIpc)) {
    std::string_view path = text.substr(kIpc.size());
    constexpr size_t kMaxUnixPath = 107;  // sizeof(sockaddr_un::sun_path) - 1
    if (path.empty()) return Status(StatusCode::kBadAddress, "ipc:// endpoint needs a path");
    if (path.size() > kMaxUnixPath) {
      return Status(StatusCode::kBadAddress,
                    fmt::format("ipc path is {} bytes long (limit {})", path.size(), kMaxUnixPath));
    }
    return Status::ok();
  }
  if (!text.starts_with(kTcp)) {
    return Status(StatusCode::kBadAddress,
                  fmt::format("{} is not a ZMQ endpoint (expected tcp://HOST:PORT, tcp://*:PORT or "
                              "ipc://PATH)",
                              quoted_excerpt(text)));
  }
  std::string_view rest = text.substr(kTcp.size());
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) {
    return Status(StatusCode::kBadAddress, "tcp endpoint needs a port (tcp://HOST:PORT)");
  }
  std::string_view host = rest.substr(0, colon);
  std::string_view port_text = rest.substr(colon + 1);
  if (port_text != "*") {
    uint64_t port = 0;
    if (!parse_port_number(port_text, &port)) {
      return Status(StatusCode::kBadAddress,
                    fmt::format("port {} is not a number or '*'", quoted_excerpt(port_text)));
    }
    if (port > 65535) {
      return Status(
          StatusCode::kOutOfRange,
          fmt::format("port {} is out of range (0..65535; 0 or * = ephemeral)", port_text));
    }
  }
  if (host == "*") return Status::ok();
  std::string parsed;
  return proto::parse_host(host, &parsed);
}

}  // namespace pdr::config

namespace pdr::config {

AllowList loopback_allow_list() {
  AllowList list;
  Cidr c;
  if (parse_cidr("127.0.0.0/8", &c)) list.cidrs.push_back(c);
  if (parse_cidr("::1/128", &c)) list.cidrs.push_back(c);
  return list;
}

bool endpoint_is_local(std::string_view endpoint) {
  if (endpoint.starts_with("ipc://")) return true;
  if (!endpoint.starts_with("tcp://")) return false;
  std::string_view rest = endpoint.substr(6);
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos) return false;
  const std::string_view host = rest.substr(0, colon);
  if (host == "localhost") return true;
  auto ip = parse_ip_address(host);
  return ip && ip->is_loopback();
}

bool Topology::Discovery::open_to_network(const std::string& plain_endpoint,
                                          const std::string& curve_endpoint) const {
  if (!allowed_peers.matches_everything()) return false;
  if (!endpoint_is_local(plain_endpoint)) return true;
  return !curve_endpoint.empty() && !endpoint_is_local(curve_endpoint) && curve.allowed_client_keys.empty();
}

}  // namespace pdr::config
