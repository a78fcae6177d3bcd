// Address parsing for discovery messages and the topology file. Pure functions, no I/O, no DNS.
//
// Accepted forms (all validated; anything else is kBadAddress with a reason):
//   host:port            "10.0.0.5:8000", "node-3.example:8000"
//   [v6]:port            "[fd00::5]:8000"  (a bare v6 literal without brackets is rejected: the
//                        port would be ambiguous)
//   http URL             "http://10.0.0.5:8000/v1/completions" (scheme http only; path kept apart)
//   MoRIIO ZMQ address   "host:10.0.0.5,handshake:6301,notify:61005" (segments split on ',', each
//                        key/value split on the first ':' so IPv6 hosts survive, as vLLM's
//                        parse_moriio_zmq_address does; keys host, handshake, notify all required,
//                        unknown keys rejected, order free)
// Hosts: IPv4 dotted quad, IPv6 literal (brackets stripped in the struct), or a DNS name
// (letters, digits, '-', '.', '_'; 1..253 chars). Ports: 1..65535.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "proto/base/status.h"

namespace pdr::proto {

struct HostPort {
  std::string host;  // without brackets, even for IPv6
  uint16_t port = 0;

  bool is_ipv6() const { return host.find(':') != std::string::npos; }
  // "host:port", or "[v6]:port" for IPv6. Canonical form used as the registry key.
  std::string to_string() const;
  friend bool operator==(const HostPort&, const HostPort&) = default;
};

struct HttpUrl {
  HostPort address;
  std::string path;  // "" or starts with '/'
};

struct MoriioZmqAddress {
  std::string host;
  uint16_t handshake_port = 0;
  uint16_t notify_port = 0;

  // "host:H,handshake:N,notify:M" exactly as vLLM formats it.
  std::string to_string() const;
  friend bool operator==(const MoriioZmqAddress&, const MoriioZmqAddress&) = default;
};

Status parse_host(std::string_view text, std::string* host);
Status parse_host_port(std::string_view text, HostPort* out);
Status parse_http_url(std::string_view text, HttpUrl* out);
Status parse_moriio_zmq_address(std::string_view text, MoriioZmqAddress* out);

// A ZMQ TCP endpoint a router connects to, "tcp://host:port" (vLLM's KV events publisher and
// replay socket, docs/design/kv-events.md, Publisher), host and port as for parse_host_port. Refused, kBadAddress:
//   - tcp://*:port and tcp://0.0.0.0 / [::] (the publisher's bind form: it names no node to
//     connect to);
//   - ipc:// and inproc:// (a path on the router's host, not the node's: a remote registration
//     naming one would make the router open an arbitrary local socket; and vLLM offsets ipc
//     endpoints per DP rank by name, not by port);
//   - any other scheme, a path, a missing port.
Status parse_zmq_tcp_endpoint(std::string_view text, HostPort* out);
// "tcp://host:port" ("tcp://[v6]:port"), the port plus `port_offset` (a DP rank: vLLM's rank r
// publishes on base port + r). Empty when the port would pass 65535.
std::string zmq_tcp_endpoint(const HostPort& endpoint, uint32_t port_offset = 0);
// DP rank `rank`'s "tcp://host:port" on endpoint's host: rank_ports[rank] when the node listed
// each rank's port (NodeSpec::kv_events_ports), else endpoint.port + rank. Empty when the list
// has no such rank or the port would pass 65535.
std::string zmq_tcp_rank_endpoint(const HostPort& endpoint, std::span<const uint16_t> rank_ports,
                                  uint32_t rank);

// Hosts compared without a lookup (no DNS: pure).
// names_loopback: a loopback literal (127.0.0.0/8, ::1, ::ffff:127.x.y.z) or "localhost" /
// "*.localhost", which always name loopback (RFC 6761 section 6.3); any case, one trailing dot.
bool names_loopback(std::string_view host);
// same_host: both name loopback, or both are IP literals of the same address (IPv4-mapped IPv6
// equals its IPv4), or both are the same name ignoring case and one trailing dot. A name and an
// address are never the same host here: telling would need a lookup.
bool same_host(std::string_view a, std::string_view b);
// side_channel_host_ok: `named` is a host a node's answer names as its KV side channel (NIXL's
// remote_host), which `peer_host`'s node will connect to. The answer is the node's own word, so
// `named` must be that node's registered host (`owner_host`), or a loopback host when both nodes
// registered the same host (one machine: vLLM's default "localhost" works there); anything else
// could aim the peer at a third host.
bool side_channel_host_ok(std::string_view named, std::string_view owner_host, std::string_view peer_host);

// True when the string looks like the MoRIIO form (contains "handshake:" or starts with "host:"),
// used to tell MoRIIO registrations from P2P-NCCL ones (whose zmq_address is plain host:port).
bool looks_like_moriio_zmq_address(std::string_view text);

}  // namespace pdr::proto
