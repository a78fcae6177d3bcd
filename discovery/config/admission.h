// Who may join the registry, and how strongly each sender proved who it is. Pure: no sockets.
//
// Every discovery message arrives with an admission class, decided per connection at the ZMQ
// handshake (discovery/zap_handler.h) and per message (the auth token):
//   kOpen     the plain endpoint with no address control (only with discovery.allow_open)
//   kAddress  the plain endpoint, peer address inside discovery.allowed_peers (vLLM nodes)
//   kToken    kOpen/kAddress plus the discovery.auth_token_env token in the message
//   kCurve    the CURVE endpoint with a client key from discovery.curve.allowed_client_keys
// and operator entries (static, admin) rank above all of them. The registry remembers the class
// that created an entry; a weaker sender can never modify, drain, take over or say goodbye to it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"
#include "proto/discovery_message.h"

namespace pdr::config {

enum class AdmissionClass : uint8_t { kOpen, kAddress, kToken, kCurve, kCount };
std::string_view to_string(AdmissionClass);  // "open", "address", "token", "curve"
bool parse_admission_class(std::string_view, AdmissionClass*);
inline bool authenticated(AdmissionClass c) { return c >= AdmissionClass::kToken; }
constexpr size_t kAdmissionClasses = static_cast<size_t>(AdmissionClass::kCount);

// An IPv4 or IPv6 address in network byte order; IPv4 is kept as 4 bytes (an IPv4-mapped IPv6
// address "::ffff:a.b.c.d" is normalised to IPv4, as a dual-stack socket reports IPv4 peers).
struct IpAddress {
  std::array<uint8_t, 16> bytes{};
  uint8_t size = 0;  // 4 or 16; 0 = not an address
  bool is_loopback() const;
  bool operator==(const IpAddress&) const = default;
};
// Parses a literal address ("10.0.0.1", "::1", "[::1]", "::ffff:10.0.0.1"); nullopt otherwise
// (host names included: this never resolves).
std::optional<IpAddress> parse_ip_address(std::string_view text);

// "10.0.0.0/8", "2001:db8::/32", or a bare address (a /32 or /128).
struct Cidr {
  IpAddress network;
  uint8_t prefix_len = 0;
  bool contains(const IpAddress& a) const;
  bool matches_everything() const { return prefix_len == 0; }
  std::string to_string() const;
};
// kInvalidValue with a message naming what is wrong ("bad address", "prefix 33 is over 32", "host
// bits set: did you mean 10.0.0.0/8?").
Status parse_cidr(std::string_view text, Cidr* out);

struct AllowList {
  std::vector<Cidr> cidrs;
  bool contains(const IpAddress& a) const;
  bool matches_everything() const;  // some entry is a /0
};

// A node may register only itself: when the sender did not authenticate (kOpen, kAddress), every
// address its message names (http_address, the zmq_address host, the KV events endpoints; the
// bootstrap server is the http_address host) must be the connection's peer address:
//   kOwn       an IP literal equal to the peer, or any loopback host (proto::names_loopback: a
//              127.x or ::1 literal, "localhost") from a loopback peer: one machine is one host;
//   kNotOwn    another IP literal (or a loopback name from a peer that is not loopback);
//   kHostName  any other name: what it resolves to is the DNS server's choice, not the sender's
//              proof, and resolving it here would let any admitted sender make pdrouter look up
//              names of its choosing, so unauthenticated senders may not name hosts at all.
// Authenticated senders (kToken, kCurve) may name any host, and `peer` nullopt (an ipc://
// endpoint: same machine) passes: both get kOwn. Pure: never resolves.
enum class AddressCheck : uint8_t { kOwn, kNotOwn, kHostName };
AddressCheck check_registered_address(AdmissionClass sender, const std::optional<IpAddress>& peer,
                                      std::string_view host);

// The first address of `reg` that `sender` may not name (check_registered_address), checked in
// the order http_address, zmq_address (the MoRIIO host or the P2P-NCCL host:port), kv_events_endpoint,
// kv_events_replay_endpoint; nullopt when every one passes. `field` is the registration key.
struct ForeignAddress {
  std::string_view field;
  std::string host;
  AddressCheck check = AddressCheck::kOwn;
};
std::optional<ForeignAddress> find_foreign_address(AdmissionClass sender, const std::optional<IpAddress>& peer,
                                                   const proto::Registration& reg);

}  // namespace pdr::config
