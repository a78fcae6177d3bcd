// Mooncake (docs/design/wire-formats.md 4): both legs carry transfer_id; the decode's kv_transfer_params
// name the prefill's engine and its bootstrap server (remote_bootstrap_addr); the prefill answers
// no kv_transfer_params. The prefill runs the bootstrap server: GET /query lists, per DP rank, the
// engine id and the worker address of each TP rank (kv_port + dp * tp_size + tp, one side-channel
// port each). The decode asks /query for the worker of the engine it was given, and the prefill
// WRITEs the KV there. Registers in the pdrouter format with the bootstrap port.
#include "node/sim/dialects/common.h"
#include "node/sim/kv_peer.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;
using namespace dialect;

std::optional<SimError> check_leg(const KvNodeIdentity&, const std::string&, const json&,
                                  KvRequest* out) {
  const json& params = out->params;
  if (out->leg == KvLeg::kDecode) {
    if (auto e = require(params, {"remote_engine_id", "remote_bootstrap_addr", "transfer_id"},
                         "Mooncake")) {
      return e;
    }
    out->peer_address = scalar_text(params["remote_bootstrap_addr"]);
  }
  // A prefill without transfer_id only logs a warning in vLLM; the transfer just never pairs.
  if (present(params, "transfer_id") && params["transfer_id"].is_string()) {
    out->transfer_id = params["transfer_id"].get<std::string>();
  }
  return std::nullopt;
}

std::vector<SidePortRange> side_channel(const KvNodeIdentity& node) {
  return {SidePortRange{"kv", &KvNodeIdentity::kv_port, node.dp_size * node.tp_size}};
}

// GET /query on remote_bootstrap_addr, then the worker_addr of the DP rank whose engine_id is
// remote_engine_id (TP rank 0).
std::optional<SimError> resolve_peer(const KvBlocks& blocks,
                                     std::chrono::steady_clock::time_point deadline,
                                     proto::HostPort* out) {
  proto::HttpUrl url;
  if (!proto::parse_http_url(blocks.peer_address, &url).is_ok()) {
    return kv_peer_error("Mooncake: bad remote_bootstrap_addr '" + blocks.peer_address + "'");
  }
  std::string body;
  if (auto e = http_get(url.address, "/query", deadline, &body)) {
    return kv_peer_error("Mooncake bootstrap " + blocks.peer_address + "/query: " + *e);
  }
  const json table = json::parse(body, nullptr, false);
  const json engine = blocks.params.is_object() ? blocks.params.value("remote_engine_id", json())
                                                : json();
  if (!table.is_object()) return kv_peer_error("Mooncake bootstrap /query: not a JSON object");
  for (const auto& [rank, entry] : table.items()) {
    if (!entry.is_object() || entry.value("engine_id", json()) != engine) continue;
    // worker_addr[tp]["0"]: TP rank 0's address (the sim's KV is the same for every TP rank).
    const json* addr = &entry;
    for (const char* step : {"worker_addr", "0", "0"}) {
      addr = addr->is_object() && addr->contains(step) ? &(*addr)[step] : nullptr;
      if (addr == nullptr) break;
    }
    if (addr == nullptr || !addr->is_string()) break;
    std::string text = addr->get<std::string>();
    if (text.starts_with("tcp://")) text = text.substr(6);
    if (!proto::parse_host_port(text, out).is_ok()) {
      return kv_peer_error("Mooncake bootstrap /query: bad worker_addr '" + text + "'");
    }
    return std::nullopt;
  }
  return kv_peer_error("Mooncake bootstrap /query has no worker for engine " + engine.dump());
}

void registration(const SimRegistrationInputs& in, proto::Registration* reg) {
  pdrouter_registration(in, reg);
  if (in.node->role == proto::Role::kPrefill) {
    reg->bootstrap_port = in.bootstrap_port.value_or(in.node->http_port);
  }
}

std::string bootstrap_query(const KvNodeIdentity& node) {
  json out = json::object();
  for (uint32_t dp = 0; dp < node.dp_size; ++dp) {
    json workers = json::object();
    for (uint32_t tp = 0; tp < node.tp_size; ++tp) {
      workers[std::to_string(tp)] = json{
          {"0", "tcp://" + node.advertise_host + ":" +
                    std::to_string(node.kv_port + dp * node.tp_size + tp)}};
    }
    out[std::to_string(dp)] = json{{"engine_id", node.engine_id + "-dp" + std::to_string(dp)},
                                   {"worker_addr", workers},
                                   {"tp_size", node.tp_size},
                                   {"pp_size", 1}};
  }
  return out.dump();
}

}  // namespace

extern const SimDialect kMooncakeSimDialect;
const SimDialect kMooncakeSimDialect{
    .name = "mooncake",
    .connector = proto::Connector::kMooncake,
    .transfer_mode = proto::TransferMode::kNone,
    .default_kv_port = 17000,
    .movement = KvMovement::kPush,
    .leg_from_role = false,
    .check_leg = check_leg,
    .prefill_answer = no_prefill_answer,
    .side_channel = side_channel,
    .resolve_peer = resolve_peer,
    .fill_registration = registration,
    .bootstrap_query = bootstrap_query,
};

}  // namespace pdr::node::sim
