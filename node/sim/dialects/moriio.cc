#include "node/sim/dialects/moriio.h"

#include "node/sim/kv_peer.h"

namespace pdr::node::sim::dialect {
namespace {

using nlohmann::json;

// Hand-written equivalents of moriio_common.py's request-id regexes (std::regex trips GCC 12's
// -Wmaybe-uninitialized under the sanitizers). Each returns false when the regex would not match.

// `___prefill_addr_(.+?)___decode_addr_`
bool prefill_address(std::string_view id, std::string* out) {
  for (size_t p = id.find(kPrefillTag); p != std::string_view::npos;
       p = id.find(kPrefillTag, p + 1)) {
    const size_t begin = p + kPrefillTag.size();
    const size_t end = id.find(kDecodeTag, begin + 1);
    if (end != std::string_view::npos) {
      *out = std::string(id.substr(begin, end - begin));
      return true;
    }
  }
  return false;
}

// `___decode_addr_(.+)_[0-9a-f]{32}(?:-.*)?$` (greedy capture).
bool decode_address(std::string_view id, std::string* out) {
  for (size_t p = id.find(kDecodeTag); p != std::string_view::npos;
       p = id.find(kDecodeTag, p + 1)) {
    const size_t begin = p + kDecodeTag.size();
    for (size_t u = id.size(); u-- > begin + 1;) {
      if (id[u] != '_' || u + 33 > id.size()) continue;
      bool hex = true;
      for (size_t i = u + 1; i < u + 33 && hex; ++i) hex = is_lower_hex(id[i]);
      if (hex && (u + 33 == id.size() || id[u + 33] == '-')) {
        *out = std::string(id.substr(begin, u - begin));
        return true;
      }
    }
  }
  return false;
}

// Explicit remote_host/remote_handshake_port/remote_notify_port win; otherwise the peer's
// zmq_address is parsed out of the request id.
std::optional<SimError> peer(const std::string& request_id, const json& params, bool prefill_leg,
                             std::string* out) {
  if (present(params, "remote_host") && present(params, "remote_handshake_port") &&
      present(params, "remote_notify_port")) {
    *out = "host:" + scalar_text(params["remote_host"]) + ",handshake:" +
           scalar_text(params["remote_handshake_port"]) +
           ",notify:" + scalar_text(params["remote_notify_port"]);
    return std::nullopt;
  }
  std::string zmq;
  // The producer (prefill) extracts the decode's address, the consumer the prefill's.
  const bool found = prefill_leg ? decode_address(request_id, &zmq)
                                 : prefill_address(request_id, &zmq);
  const char* which = prefill_leg ? "decode" : "prefill";
  if (!found) {
    return bad("bad_request_id", std::string("MoRIIO: cannot find the ") + which +
                                     " address in request id '" + request_id + "'");
  }
  proto::MoriioZmqAddress address;
  if (!proto::parse_moriio_zmq_address(zmq, &address).is_ok()) {
    return bad("bad_request_id", std::string("MoRIIO: bad ") + which + " zmq address '" + zmq +
                                     "' in request id");
  }
  *out = address.to_string();
  return std::nullopt;
}

}  // namespace

std::optional<SimError> moriio_check_leg(const KvNodeIdentity&, const std::string& request_id,
                                         const json&, KvRequest* out) {
  const json& params = out->params;
  if (!present(params, "transfer_id") || !params["transfer_id"].is_string()) {
    return bad("missing_transfer_id", "MoRIIO kv_transfer_params: missing 'transfer_id'");
  }
  out->transfer_id = params["transfer_id"].get<std::string>();
  return peer(request_id, params, out->leg == KvLeg::kPrefill, &out->peer_address);
}

json moriio_prefill_answer(const KvNodeIdentity& node, const KvRequest& request,
                           const std::string&, const std::vector<int64_t>& blocks) {
  return json{{"do_remote_prefill", true},
              {"do_remote_decode", false},
              {"remote_block_ids", blocks},
              {"remote_engine_id", node.advertise_host + ":" + std::to_string(node.handshake_port)},
              {"remote_host", node.advertise_host},
              {"remote_handshake_port", node.handshake_port},
              {"remote_notify_port", node.notify_port},
              {"remote_dp_size", node.dp_size},
              {"tp_size", node.tp_size},
              {"transfer_id", request.transfer_id}};
}

std::vector<SidePortRange> moriio_side_channel(const KvNodeIdentity&) {
  return {SidePortRange{"handshake", &KvNodeIdentity::handshake_port, 1},
          SidePortRange{"notify", &KvNodeIdentity::notify_port, 1}};
}

std::optional<SimError> moriio_resolve_peer(const KvBlocks& blocks,
                                            std::chrono::steady_clock::time_point,
                                            proto::HostPort* out) {
  proto::MoriioZmqAddress zmq;
  if (!proto::parse_moriio_zmq_address(blocks.peer_address, &zmq).is_ok()) {
    return kv_peer_error("MoRIIO: bad prefill address '" + blocks.peer_address + "'");
  }
  *out = proto::HostPort{zmq.host, zmq.handshake_port};
  return std::nullopt;
}

void moriio_registration(const SimRegistrationInputs& in, proto::Registration* reg) {
  const KvNodeIdentity& node = *in.node;
  reg->format = proto::RegistrationFormat::kMoriio;
  proto::MoriioZmqAddress zmq{node.advertise_host, node.handshake_port, node.notify_port};
  reg->zmq_address = zmq.to_string();
  reg->moriio_zmq = zmq;
  reg->transfer_mode = node.transfer_mode;
  reg->dp_size = node.dp_size;
  reg->tp_size = node.tp_size;
}

}  // namespace pdr::node::sim::dialect
