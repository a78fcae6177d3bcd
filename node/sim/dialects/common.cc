#include "node/sim/dialects/common.h"

#include "node/sim/kv_peer.h"

namespace pdr::node::sim::dialect {

using nlohmann::json;

SimError bad(std::string reason, std::string message) {
  return SimError{400, std::move(reason), std::move(message)};
}

std::string scalar_text(const json& value) {
  return value.is_string() ? value.get<std::string>() : value.dump();
}

bool present(const json& params, const char* key) {
  return params.is_object() && params.contains(key) && !params[key].is_null();
}

std::optional<SimError> require(const json& params, std::initializer_list<const char*> keys,
                                const std::string& dialect) {
  for (const char* key : keys) {
    if (!present(params, key)) {
      return bad("missing_" + std::string(key),
                 dialect + " kv_transfer_params: missing '" + key + "'");
    }
  }
  return std::nullopt;
}

json no_prefill_answer(const KvNodeIdentity&, const KvRequest&, const std::string&,
                       const std::vector<int64_t>&) {
  return nullptr;
}

std::vector<SidePortRange> one_kv_port(const KvNodeIdentity&) { return {SidePortRange{}}; }

std::optional<SimError> host_port_peer(const KvBlocks& blocks,
                                       std::chrono::steady_clock::time_point,
                                       proto::HostPort* out) {
  if (!proto::parse_host_port(blocks.peer_address, out).is_ok()) {
    return kv_peer_error("bad prefill KV address '" + blocks.peer_address + "'");
  }
  return std::nullopt;
}

void pdrouter_registration(const SimRegistrationInputs& in, proto::Registration* reg) {
  reg->format = proto::RegistrationFormat::kPdrouter;
  reg->schema_version = 1;
  reg->dp_size = in.node->dp_size;
  reg->tp_size = in.node->tp_size;
  reg->model = in.model;
}

}  // namespace pdr::node::sim::dialect
