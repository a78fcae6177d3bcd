// SGLang (docs/design/wire-formats.md 7): no kv_transfer_params; the node's role decides the leg and the
// decode finds its prefill at bootstrap_host:bootstrap_port from the request body. The sim's
// prefill serves its KV side channel there (kv_port, registered as its bootstrap_port when it
// moves real KV) and WRITEs the KV into the decode's blocks. Registers in the pdrouter format.
#include "node/sim/dialects/common.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;
using namespace dialect;

// "HOST:PORT" from the body's bootstrap_host / bootstrap_port (empty when either is missing or
// null: the decode then fails when it looks for its KV).
std::string bootstrap_address(const json& body) {
  if (!body.is_object() || !present(body, "bootstrap_host") || !present(body, "bootstrap_port")) {
    return "";
  }
  const std::string host = scalar_text(body["bootstrap_host"]);
  // An IPv6 host comes bracketed already (REQUEST_LEGS.md, SGLang).
  return host + ":" + scalar_text(body["bootstrap_port"]);
}

std::optional<SimError> check_leg(const KvNodeIdentity&, const std::string&, const json& body,
                                  KvRequest* out) {
  if (out->leg == KvLeg::kDecode) out->peer_address = bootstrap_address(body);
  return std::nullopt;
}

void registration(const SimRegistrationInputs& in, proto::Registration* reg) {
  pdrouter_registration(in, reg);
  // SGLang decodes find the prefill's KV at bootstrap_host:bootstrap_port.
  if (in.node->role == proto::Role::kPrefill && in.moves_kv) reg->bootstrap_port = in.node->kv_port;
}

}  // namespace

extern const SimDialect kSglangSimDialect;
const SimDialect kSglangSimDialect{
    .name = "sglang",
    .connector = proto::Connector::kSglang,
    .transfer_mode = proto::TransferMode::kNone,
    .default_kv_port = 5600,
    .movement = KvMovement::kPush,
    .leg_from_role = true,
    .check_leg = check_leg,
    .prefill_answer = no_prefill_answer,
    .side_channel = one_kv_port,
    .resolve_peer = host_port_peer,
    .fill_registration = registration,
    .bootstrap_query = nullptr,
};

}  // namespace pdr::node::sim
