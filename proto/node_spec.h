// One prefill or decode node as pdrouter describes it, whoever described it: the node itself (a
// discovery registration, proto::Registration), the operator (the topology file's `instances:` and
// POST /admin/instances, config::StaticInstance), or the registry that merges both
// (discovery::Instance). Each of those types derives from NodeSpec and adds only what is its own
// (wire format and liveness, registry state), so a field is declared once and moving a node's
// description between them is a base-class assignment, comparing it a defaulted operator==.
//
// NodeEndpoint is the part the request-leg builder needs (proto::LegInstance derives from it):
// copying it per request leaves the node's model and labels, which no leg needs, where they are.
//
// Plain data; no I/O. The enum names (to_string / parse_*) are in discovery_names.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/address.h"
#include "proto/connectors.h"

namespace pdr::proto {

enum class Role : uint8_t { kPrefill, kDecode };
enum class TransferMode : uint8_t { kNone, kRead, kWrite };  // kNone: dialect has no mode (P2P-NCCL)
// Connector, the KV connector enum, is declared with its table of names in proto/connectors.h.

// Lower-case names used in /status, the topology file and CLI flags:
// role "prefill"/"decode"; mode "READ"/"WRITE"/"none"; connector: its row's name in
// proto/connectors.h, the one table of connector names and spellings ("unknown" for kUnknown).
std::string_view to_string(Role);
std::string_view to_string(TransferMode);
std::string_view to_string(Connector);
// Parsers for the same names (plus "P"/"D" for roles, any case for modes and connectors, and the
// connectors' aliases from their rows). Return false when the text is not a known name.
bool parse_role(std::string_view, Role*);
bool parse_transfer_mode(std::string_view, TransferMode*);
bool parse_connector(std::string_view, Connector*);

using Labels = std::vector<std::pair<std::string, std::string>>;  // sorted by key, unique keys

// How to reach a node and what its KV connector speaks: everything a request leg to it, and the
// peer leg that pairs with it, is built from.
struct NodeEndpoint {
  Connector connector = Connector::kUnknown;
  TransferMode transfer_mode = TransferMode::kNone;  // MoRIIO: kRead / kWrite; others kNone
  HostPort http_address;    // the registry key (canonical HostPort::to_string())
  std::string zmq_address;  // verbatim as the node (or operator) gave it; embedded in request ids
  // zmq_address parsed: MoRIIO's composite "host:..,handshake:..,notify:.." form, or P2P-NCCL's
  // host:port. Unset when zmq_address is empty or in neither form (fill_parsed_zmq_address).
  std::optional<MoriioZmqAddress> moriio_zmq;
  std::optional<HostPort> kv_address;
  uint32_t dp_size = 1;  // 1..1024
  uint32_t tp_size = 1;  // 1..1024
  // Mooncake / SGLang: the node's bootstrap server port.
  std::optional<uint16_t> bootstrap_port;
  // NIXL push prefill: its kv_transfer_config engine_id (with data parallelism vLLM suffixes it
  // "_dp<rank>" per rank; the leg builder does the same) and its pipeline-parallel size, which a
  // push decode needs before the prefill answers. Empty / 1 for every other node.
  std::string engine_id;  // <= 256 bytes
  uint32_t pp_size = 1;   // 1..1024
  friend bool operator==(const NodeEndpoint&, const NodeEndpoint&) = default;
};

struct NodeSpec : NodeEndpoint {
  Role role = Role::kPrefill;
  std::string model;  // served model ("" = any)
  Labels labels;      // <= 32 labels; keys <= 64 chars, values <= 256 chars
  // vLLM's KV cache events publisher (`--kv-events-config` endpoint) and its replay socket, as
  // tcp://host:port for DP rank 0 (rank r: port + r, unless the lists below say otherwise). proto::parse_zmq_tcp_endpoint validates,
  // proto::zmq_tcp_endpoint formats. Unset: the topology's kv_events.default_port, if any.
  std::optional<HostPort> kv_events_endpoint;
  std::optional<HostPort> kv_events_replay_endpoint;
  // Each DP rank's port (dp_size entries, entry 0 the endpoint's own), for a node whose ranks do
  // not sit at port + r: `pdnode sim` binds an ephemeral port per rank, since an ephemeral base
  // plus r may be any other process's port. Empty: port + r, as vLLM lays them out.
  // proto::zmq_tcp_rank_endpoint picks rank r's endpoint either way.
  std::vector<uint16_t> kv_events_ports;
  std::vector<uint16_t> kv_events_replay_ports;
  friend bool operator==(const NodeSpec&, const NodeSpec&) = default;
};

// Sets moriio_zmq (when zmq_address is in the MoRIIO composite form) or kv_address (when it is a
// host:port) from zmq_address, for a description that carries neither yet (an operator's; the
// discovery decoder fills them itself and refuses what does not parse). An empty or unparseable
// zmq_address leaves both unset.
void fill_parsed_zmq_address(NodeEndpoint* node);

}  // namespace pdr::proto
