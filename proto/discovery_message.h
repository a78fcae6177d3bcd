// Discovery messages: what prefill/decode nodes send to pdrouter's ZMQ ROUTER socket, decoded from
// untrusted bytes, and pdrouter's own extended registration / goodbye / acknowledgement encoded for
// the node-side client. Pure functions over byte spans; no I/O. Schema: proto/DISCOVERY.md.
//
// Dialects accepted (facts: shared/PROTOCOLS.md sections 1 and 2):
//   MoRIIO current  {type:"P"|"D", http_address, zmq_address:"host:..,handshake:..,notify:..",
//                    dp_size, tp_size, transfer_mode:"READ"|"WRITE"}
//   MoRIIO legacy   {type:"register", role:"P"|"D", index, request_address:"http://ip:port/v1/..",
//                    handshake_port, notify_port, dp_size, tp_size, transfer_mode}
//   P2P-NCCL        {type:"P"|"D", http_address, zmq_address:"ip:port"}
//   HELLO           {type:"HELLO"} ignored (kind kHello) unless it carries pdrouter's fields
//   pdrouter        any of the above shapes plus `pdr_v` (schema version) and optional extension
//                   keys; also {type:"goodbye", pdr_v, http_address, ...}
// Unknown keys are ignored (vLLM may add some); known keys are type-checked. Integers of any msgpack
// width and sign are accepted where vLLM may send them, then range-checked. transfer_mode is
// case-insensitive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/address.h"
#include "base/status.h"

namespace pdr::proto {

enum class Role : uint8_t { kPrefill, kDecode };
enum class TransferMode : uint8_t { kNone, kRead, kWrite };  // kNone: dialect has no mode (P2P-NCCL)
enum class Connector : uint8_t { kUnknown, kMoriio, kP2pNccl, kNixl, kMooncake, kSglang };
// Which wire shape the registration arrived in (or "static": came from the topology file).
enum class RegistrationFormat : uint8_t { kMoriio, kMoriioLegacy, kP2pNccl, kPdrouter, kStatic };

// Lower-case names used in /status, the topology file and CLI flags:
// role "prefill"/"decode"; mode "READ"/"WRITE"/"none"; connector "moriio", "p2p-nccl", "nixl",
// "mooncake", "sglang", "unknown"; format "moriio", "moriio-legacy", "p2p-nccl", "pdrouter", "static".
std::string_view to_string(Role);
std::string_view to_string(TransferMode);
std::string_view to_string(Connector);
std::string_view to_string(RegistrationFormat);
// Parsers for the same names (plus "P"/"D" for roles, any case for modes, "p2p_nccl"/"p2pnccl" for
// the connector). Return false when the text is not a known name.
bool parse_role(std::string_view, Role*);
bool parse_transfer_mode(std::string_view, TransferMode*);
bool parse_connector(std::string_view, Connector*);
bool parse_registration_format(std::string_view, RegistrationFormat*);

struct NodeLoad {
  bool present = false;
  uint32_t running = 0;         // requests running on the node
  uint32_t waiting = 0;         // requests queued on the node
  uint64_t free_kv_blocks = 0;  // free KV-cache blocks
  friend bool operator==(const NodeLoad&, const NodeLoad&) = default;
};

using Labels = std::vector<std::pair<std::string, std::string>>;  // sorted by key, unique keys

struct Registration {
  RegistrationFormat format = RegistrationFormat::kMoriio;
  Role role = Role::kPrefill;
  HostPort http_address;            // the registry key (canonical HostPort::to_string())
  std::string zmq_address;          // verbatim, as the node sent it (embedded in request ids)
  std::optional<MoriioZmqAddress> moriio_zmq;  // MoRIIO formats (legacy: built from its ports)
  std::optional<HostPort> kv_address;          // P2P-NCCL: zmq_address parsed as host:port
  uint32_t dp_size = 1;             // 1..1024
  uint32_t tp_size = 1;             // 1..1024
  TransferMode transfer_mode = TransferMode::kNone;
  Connector connector = Connector::kUnknown;  // implied by format unless the extension says
  std::string legacy_index;         // MoRIIO legacy `index` (a counter as a string)

  // pdrouter extension (present when schema_version > 0).
  uint32_t schema_version = 0;      // `pdr_v`
  std::string instance_id;          // stable per node process lifetime; <= 128 chars
  uint64_t epoch = 0;               // bumps on node restart -> counted as a restart
  std::string model;
  std::optional<uint16_t> bootstrap_port;  // Mooncake / SGLang bootstrap server port
  Labels labels;                    // <= 32 labels; keys <= 64 chars, values <= 256 chars
  NodeLoad load;
  bool draining = false;
  std::optional<uint32_t> ttl_ms;   // requested TTL; the registry clamps it to its bounds
  std::string auth_token;           // compared in constant time by the listener
  friend bool operator==(const Registration&, const Registration&) = default;
};

struct Goodbye {
  HostPort http_address;
  uint32_t schema_version = 1;
  std::string instance_id;
  uint64_t epoch = 0;
  std::string auth_token;
  friend bool operator==(const Goodbye&, const Goodbye&) = default;
};

struct DiscoveryMessage {
  enum class Kind : uint8_t { kRegistration, kHello, kGoodbye };
  Kind kind = Kind::kHello;
  Registration registration;  // valid when kind == kRegistration
  Goodbye goodbye;            // valid when kind == kGoodbye
};

// Reply pdrouter sends (on the same ROUTER socket, to the sender's identity) to messages carrying
// `pdr_v`. Plain vLLM nodes get nothing back.
struct Ack {
  bool ok = true;
  std::string reason;       // code_label + message when !ok
  uint32_t ttl_ms = 0;      // the TTL the registry applies to this node
  uint64_t registry_version = 0;
  friend bool operator==(const Ack&, const Ack&) = default;
};

struct DecodeLimits {
  size_t max_message_bytes = 64 * 1024;
  size_t max_depth = 4;          // map -> labels map -> value is depth 2; generous headroom
  size_t max_array_items = 64;
  size_t max_map_entries = 64;
  size_t max_string_bytes = 4096;
  size_t max_bin_bytes = 0;      // bin/ext are never valid in these messages
};

// Decodes one payload frame. On failure `out` is left in an unspecified but valid state and the
// Status names the problem precisely (e.g. "missing_key: dp_size is required for MoRIIO
// registrations", "bad_address: zmq_address 'host:1.2.3.4,notify:x': notify port is not a number").
Status decode_discovery_message(std::span<const std::byte> bytes, const DecodeLimits& limits,
                                DiscoveryMessage* out);

// Encodes a registration in the wire shape named by reg.format (kStatic is not encodable and
// yields an empty string). For kPdrouter the map carries the MoRIIO-current base keys when the
// fields allow it (so vLLM-style parsers that ignore unknown keys understand it) plus `pdr_v` and
// every set extension key.
std::string encode_registration(const Registration& reg);
std::string encode_goodbye(const Goodbye& goodbye);
std::string encode_ack(const Ack& ack);
Status decode_ack(std::span<const std::byte> bytes, Ack* out);

inline std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace pdr::proto
