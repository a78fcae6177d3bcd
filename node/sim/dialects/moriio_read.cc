// MoRIIO READ (docs/design/wire-formats.md 1): the decode READs the prefill's remote_block_ids, so its
// kv_transfer_params must carry them and the prefill's engine id. The rest is shared with MoRIIO
// WRITE (moriio.h).
#include "node/sim/dialects/moriio.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;
using namespace dialect;

std::optional<SimError> check_leg(const KvNodeIdentity& node, const std::string& request_id,
                                  const json& body, KvRequest* out) {
  if (auto e = moriio_check_leg(node, request_id, body, out)) return e;
  if (out->leg != KvLeg::kDecode) return std::nullopt;
  return require(out->params, {"remote_block_ids", "remote_engine_id"}, "MoRIIO READ");
}

}  // namespace

extern const SimDialect kMoriioReadSimDialect;
const SimDialect kMoriioReadSimDialect{
    .name = "moriio-read",
    .connector = proto::Connector::kMoriio,
    .transfer_mode = proto::TransferMode::kRead,
    .default_kv_port = 5600,  // unused: MoRIIO's side channel is its handshake/notify ports
    .movement = KvMovement::kPull,
    .leg_from_role = false,
    .check_leg = check_leg,
    .prefill_answer = moriio_prefill_answer,
    .side_channel = moriio_side_channel,
    .resolve_peer = moriio_resolve_peer,
    .fill_registration = moriio_registration,
    .bootstrap_query = nullptr,
};

}  // namespace pdr::node::sim
