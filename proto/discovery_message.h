// Discovery messages: what prefill/decode nodes send to pdrouter's ZMQ ROUTER socket, decoded from
// untrusted bytes, and pdrouter's own extended registration / goodbye / acknowledgement encoded for
// the node-side client. Pure functions over byte spans; no I/O. Schema: proto/DISCOVERY.md.
//
// Dialects accepted (facts: docs/design/wire-formats.md sections 1 and 2):
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
#include "proto/node_spec.h"
#include "proto/base/status.h"

namespace pdr::proto {

// Which wire shape the registration arrived in (or "static": came from the topology file).
enum class RegistrationFormat : uint8_t { kMoriio, kMoriioLegacy, kP2pNccl, kPdrouter, kStatic };

// Names as node_spec.h's enums have them: "moriio", "moriio-legacy", "p2p-nccl", "pdrouter",
// "static"; the parser returns false when the text is not one of them.
std::string_view to_string(RegistrationFormat);
bool parse_registration_format(std::string_view, RegistrationFormat*);

struct NodeLoad {
  bool present = false;
  uint32_t running = 0;         // requests running on the node
  uint32_t waiting = 0;         // requests queued on the node
  uint64_t free_kv_blocks = 0;  // free KV-cache blocks
  friend bool operator==(const NodeLoad&, const NodeLoad&) = default;
};

// The node's description (NodeSpec) as decoded from its message, plus what only the message has.
// Decoded: connector is implied by format unless the pdrouter extension says; moriio_zmq is set for
// the MoRIIO formats (legacy: built from its ports), kv_address for P2P-NCCL (zmq_address parsed as
// host:port); model, bootstrap_port and labels come from the pdrouter extension only.
struct Registration : NodeSpec {
  RegistrationFormat format = RegistrationFormat::kMoriio;
  std::string legacy_index;         // MoRIIO legacy `index` (a counter as a string)
  // `connector: "none"` (pdrouter extension): the node has no KV connector (a render node, see
  // discovery/config/instance_spec.h). connector stays kUnknown and is not inferred from zmq_address; the
  // encoder writes "none" back. Older encoders never wrote it, so its absence still means "infer".
  bool no_connector = false;

  // pdrouter extension (present when schema_version > 0).
  uint32_t schema_version = 0;      // `pdr_v`
  std::string instance_id;          // stable per node process lifetime; <= 128 chars
  uint64_t epoch = 0;               // bumps on node restart -> counted as a restart
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
// The kPdrouter encoding of `reg` (whatever reg.format says) with `extra` string entries after its
// own keys: keys the decoder above ignores, for codecs that carry a registration plus something
// of their own (proto/etcd_registry_entry.h).
std::string encode_pdrouter_registration(const Registration& reg,
                                         std::span<const std::pair<std::string_view, std::string_view>> extra);
std::string encode_goodbye(const Goodbye& goodbye);
std::string encode_ack(const Ack& ack);
Status decode_ack(std::span<const std::byte> bytes, Ack* out);

inline std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace pdr::proto
