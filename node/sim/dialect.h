// SimDialect: everything `pdnode sim` knows about one KV connector dialect, as a small table of
// callbacks (in the spirit of h2o's balancers: a struct of function pointers per policy). The
// generic simulator (sim_server, sim_kv, sim_kv_mover, sim_kv_peer, sim_command) drives requests,
// KV movement and registration and asks the dialect only where the connectors differ
// (docs/design/wire-formats.md):
//   - which leg a request is and what it must carry (check_leg, leg_from_role);
//   - what a finished prefill answers in kv_transfer_params (prefill_answer);
//   - how KV moves (movement: the decode READs, or the prefill WRITEs into the decode's blocks);
//   - which side-channel ports a node binds and advertises (side_channel), and where a decode
//     finds its prefill's (resolve_peer);
//   - what the node registers with a router (fill_registration);
//   - a bootstrap server, if the dialect's prefill runs one (bootstrap_query: Mooncake's /query).
//
// One file per dialect in node/sim/dialects/ defines one SimDialect; node/sim/dialects/table.cc
// lists them. Adding a dialect = one new file there + its line in the table.
// All callbacks are pure functions of their arguments (resolve_peer may block on the network,
// bounded by its deadline) and are called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim/error.h"
#include "node/sim/kv.h"
#include "proto/address.h"
#include "proto/discovery_message.h"

namespace pdr::node::sim {

// How a decode gets its KV (node/sim/kv_mover.h): kPull, it READs the prefill's blocks
// (NIXL, MoRIIO READ); kPush, it names blocks of its own and the prefill WRITEs into them.
enum class KvMovement { kPull, kPush };

// `count` consecutive side-channel ports starting at node.*base (a 0 base binds an ephemeral first
// port and the others follow it). `name` is the key under GET /sim/kv's "side_channel".
struct SidePortRange {
  const char* name = "kv";
  uint16_t KvNodeIdentity::*base = &KvNodeIdentity::kv_port;
  uint32_t count = 1;
};

// What a node's registration is made from.
struct SimRegistrationInputs {
  const KvNodeIdentity* node = nullptr;
  std::optional<uint16_t> bootstrap_port;  // a separate bootstrap listener's bound port, if any
  std::string model;
  bool moves_kv = false;  // --kv-backends other than none: the side channel is served
};

struct SimDialect {
  const char* name;  // e.g. "moriio-write", for messages
  proto::Connector connector;
  proto::TransferMode transfer_mode;  // kNone for connectors without modes
  uint16_t default_kv_port;           // --kv-port's default
  KvMovement movement;
  // true: requests carry no kv_transfer_params; the node's --role decides the leg.
  bool leg_from_role;

  // A prefill or decode leg (already matched against the node's role; out->leg, params and
  // dp_rank set): refuse what the real connector would refuse, fill out->transfer_id and
  // out->peer_address. `body` is the whole request body.
  std::optional<SimError> (*check_leg)(const KvNodeIdentity& node, const std::string& request_id,
                                       const nlohmann::json& body, KvRequest* out);
  // A finished prefill leg's kv_transfer_params (null: the dialect answers none). `internal_id` is
  // the engine-internal request id, `blocks` the remote_block_ids to advertise.
  nlohmann::json (*prefill_answer)(const KvNodeIdentity& node, const KvRequest& request,
                                   const std::string& internal_id,
                                   const std::vector<int64_t>& blocks);
  // The side-channel port ranges a node moving real KV binds, in binding order; the first range's
  // first port is the one `pdnode sim` prints as kv=.
  std::vector<SidePortRange> (*side_channel)(const KvNodeIdentity& node);
  // Where a decode finds its prefill's KV side channel, from blocks.peer_address (never empty
  // here) and blocks.params. Blocking, bounded by `deadline`.
  std::optional<SimError> (*resolve_peer)(const KvBlocks& blocks,
                                          std::chrono::steady_clock::time_point deadline,
                                          proto::HostPort* out);
  // Fills the registration's dialect part (role, http_address and connector are already set).
  void (*fill_registration)(const SimRegistrationInputs& in, proto::Registration* reg);
  // A prefill's bootstrap server answer (GET /query), or nullptr when the dialect has none.
  std::string (*bootstrap_query)(const KvNodeIdentity& node);
};

// The dialects, in the order `--connector` lists them (node/sim/dialects/table.cc).
const std::vector<const SimDialect*>& sim_dialects();

// The dialect of a connector and transfer mode, or nullptr.
const SimDialect* find_sim_dialect(proto::Connector connector, proto::TransferMode mode);
inline const SimDialect* find_sim_dialect(const KvNodeIdentity& node) {
  return find_sim_dialect(node.connector, node.transfer_mode);
}

// The mode `--transfer-mode` defaults to for a connector (its first dialect's), kNone when the
// connector has no modes.
proto::TransferMode default_transfer_mode(proto::Connector connector);

// Total number of side-channel ports a node binds (all ranges).
uint32_t side_port_count(const SimDialect& dialect, const KvNodeIdentity& node);

}  // namespace pdr::node::sim
