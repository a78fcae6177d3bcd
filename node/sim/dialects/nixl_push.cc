// NIXL push (vLLM's NixlPushConnector, vllm-project/vllm#35264): the decode gets its prefill's
// coordinates up front (remote_engine_id, remote_host:remote_port = the prefill's side channel for
// its DP rank, tp_size, pp_size) plus the transfer_id both legs share; it allocates its blocks and
// registers them with the prefill, which WRITEs its KV there once its own leg has finished. Here
// the registration is the side channel's write request keyed by transfer_id (node/sim/kv_mover.h,
// kPush). The prefill answers the push scheduler's kv_transfer_params (transfer_mode "push"). One
// side-channel port per DP rank, as NIXL pull; registers in the pdrouter format with its side
// channel as zmq_address and its engine id.
#include "node/sim/dialects/common.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;
using namespace dialect;

std::optional<SimError> check_leg(const KvNodeIdentity&, const std::string&, const json&, KvRequest* out) {
  const json& params = out->params;
  if (out->leg == KvLeg::kDecode) {
    if (auto e = require(params, {"remote_engine_id", "remote_host", "remote_port", "tp_size", "remote_request_id"},
                         "NIXL push")) {
      return e;
    }
    out->peer_address = scalar_text(params["remote_host"]) + ":" + scalar_text(params["remote_port"]);
  }
  // Both legs must carry the same transfer_id: the prefill pairs the decode's registration by it.
  if (!present(params, "transfer_id") || !params["transfer_id"].is_string() ||
      params["transfer_id"].get<std::string>().empty()) {
    return bad("missing_transfer_id", "NIXL push kv_transfer_params: missing 'transfer_id'");
  }
  out->transfer_id = params["transfer_id"].get<std::string>();
  return std::nullopt;
}

std::string rank_engine_id(const KvNodeIdentity& node, uint32_t rank) {
  return node.dp_size > 1 ? node.engine_id + "_dp" + std::to_string(rank) : node.engine_id;
}

json prefill_answer(const KvNodeIdentity& node, const KvRequest& request, const std::string& internal_id,
                    const std::vector<int64_t>& blocks) {
  return json{{"do_remote_prefill", true},
              {"do_remote_decode", false},
              {"remote_block_ids", blocks},
              {"remote_engine_id", rank_engine_id(node, request.dp_rank)},
              {"remote_request_id", internal_id},
              {"remote_host", node.advertise_host},
              {"remote_port", node.kv_port + request.dp_rank},
              {"tp_size", node.tp_size},
              {"pp_size", 1},
              {"remote_num_tokens", static_cast<int64_t>(blocks.size() * kKvBlockTokens)},
              {"transfer_mode", "push"}};
}

std::vector<SidePortRange> side_channel(const KvNodeIdentity& node) {
  return {SidePortRange{"kv", &KvNodeIdentity::kv_port, node.dp_size}};
}

void registration(const SimRegistrationInputs& in, proto::Registration* reg) {
  pdrouter_registration(in, reg);
  const KvNodeIdentity& node = *in.node;
  reg->zmq_address = node.advertise_host + ":" + std::to_string(node.kv_port);
  reg->kv_address = proto::HostPort{node.advertise_host, node.kv_port};
  reg->engine_id = node.engine_id;
}

}  // namespace

extern const SimDialect kNixlPushSimDialect;
const SimDialect kNixlPushSimDialect{
    .name = "nixl-push",
    .connector = proto::Connector::kNixlPush,
    .transfer_mode = proto::TransferMode::kNone,
    .default_kv_port = 5600,  // VLLM_NIXL_SIDE_CHANNEL_PORT's default
    .movement = KvMovement::kPush,
    .leg_from_role = false,
    .check_leg = check_leg,
    .prefill_answer = prefill_answer,
    .side_channel = side_channel,
    .resolve_peer = host_port_peer,
    .fill_registration = registration,
    .bootstrap_query = nullptr,
};

}  // namespace pdr::node::sim
