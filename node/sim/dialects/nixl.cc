// NIXL (docs/design/wire-formats.md 3): the prefill answers remote_block_ids, its engine id, its internal
// request id and its side channel remote_host:remote_port (kv_port + DP rank); the decode READs
// the blocks from there. One side-channel port per DP rank. Registers in the pdrouter format.
#include "node/sim/dialects/common.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;
using namespace dialect;

std::optional<SimError> check_leg(const KvNodeIdentity&, const std::string&, const json&,
                                  KvRequest* out) {
  if (out->leg != KvLeg::kDecode) return std::nullopt;
  const json& params = out->params;
  if (auto e = require(params,
                       {"remote_block_ids", "remote_engine_id", "remote_request_id",
                        "remote_host", "remote_port"},
                       "NIXL")) {
    return e;
  }
  out->peer_address = scalar_text(params["remote_host"]) + ":" + scalar_text(params["remote_port"]);
  return std::nullopt;
}

json prefill_answer(const KvNodeIdentity& node, const KvRequest& request,
                    const std::string& internal_id, const std::vector<int64_t>& blocks) {
  return json{{"do_remote_prefill", true},
              {"do_remote_decode", false},
              {"remote_block_ids", blocks},
              {"remote_engine_id", node.engine_id},
              {"remote_request_id", internal_id},
              {"remote_host", node.advertise_host},
              {"remote_port", node.kv_port + request.dp_rank},
              {"tp_size", node.tp_size}};
}

std::vector<SidePortRange> side_channel(const KvNodeIdentity& node) {
  return {SidePortRange{"kv", &KvNodeIdentity::kv_port, node.dp_size}};
}

}  // namespace

extern const SimDialect kNixlSimDialect;
const SimDialect kNixlSimDialect{
    .name = "nixl",
    .connector = proto::Connector::kNixl,
    .transfer_mode = proto::TransferMode::kNone,
    .default_kv_port = 5600,  // VLLM_NIXL_SIDE_CHANNEL_PORT's default
    .movement = KvMovement::kPull,
    .leg_from_role = false,
    .check_leg = check_leg,
    .prefill_answer = prefill_answer,
    .side_channel = side_channel,
    .resolve_peer = host_port_peer,
    .fill_registration = pdrouter_registration,
    .bootstrap_query = nullptr,
};

}  // namespace pdr::node::sim
