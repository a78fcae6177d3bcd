// P2P-NCCL (docs/design/wire-formats.md 2): no kv_transfer_params; the node's role decides the leg and
// the request id carries both KV addresses (___prefill_addr_IP:PORT___decode_addr_IP:PORT). The
// decode contacts the prefill's address and the prefill WRITEs the KV. Registers in P2P-NCCL's
// own format with its zmq (KV) address.
#include "node/sim/dialects/common.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;
using namespace dialect;

// The connector's `TAG(.*):(\d+)` followed by `suffix` (empty: anything may follow).
bool tagged_address(std::string_view id, std::string_view tag, std::string_view suffix,
                    std::string* out) {
  const size_t p = id.find(tag);
  if (p == std::string_view::npos) return false;
  const size_t begin = p + tag.size();
  for (size_t colon = id.size(); colon-- > begin;) {
    if (id[colon] != ':') continue;
    size_t end = colon + 1;
    while (end < id.size() && is_digit(id[end])) ++end;
    if (end == colon + 1) continue;
    if (!suffix.empty() && id.substr(end, suffix.size()) != suffix) continue;
    *out = std::string(id.substr(begin, end - begin));
    return true;
  }
  return false;
}

std::optional<SimError> check_leg(const KvNodeIdentity&, const std::string& request_id,
                                  const json&, KvRequest* out) {
  std::string prefill;
  std::string decode;
  if (!tagged_address(request_id, kPrefillTag, "___", &prefill) ||
      !tagged_address(request_id, kDecodeTag, "", &decode)) {
    return bad("bad_request_id",
               "P2P-NCCL: request id '" + request_id +
                   "' must carry ___prefill_addr_IP:PORT___decode_addr_IP:PORT");
  }
  out->peer_address = out->leg == KvLeg::kPrefill ? decode : prefill;
  return std::nullopt;
}

void registration(const SimRegistrationInputs& in, proto::Registration* reg) {
  const KvNodeIdentity& node = *in.node;
  reg->format = proto::RegistrationFormat::kP2pNccl;
  proto::HostPort kv{node.advertise_host, node.kv_port};
  reg->zmq_address = kv.to_string();
  reg->kv_address = kv;
}

}  // namespace

extern const SimDialect kP2pNcclSimDialect;
const SimDialect kP2pNcclSimDialect{
    .name = "p2p-nccl",
    .connector = proto::Connector::kP2pNccl,
    .transfer_mode = proto::TransferMode::kNone,
    .default_kv_port = 21001,
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
