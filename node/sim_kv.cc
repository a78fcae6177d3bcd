#include "node/sim_kv.h"

#include <charconv>
#include <string_view>

#include "proto/address.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;
using proto::Connector;
using proto::Role;

constexpr uint32_t kTokensPerBlock = 16;

SimError bad(std::string reason, std::string message) {
  return SimError{400, std::move(reason), std::move(message)};
}

bool truthy(const json& params, const char* key) {
  return params.is_object() && params.contains(key) && params[key].is_boolean() &&
         params[key].get<bool>();
}

// A JSON scalar as text: strings without their quotes, anything else as JSON.
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

std::optional<SimError> parse_dp_rank(const KvNodeIdentity& node,
                                      const std::optional<std::string>& header, uint32_t* rank) {
  *rank = 0;
  if (!header) return std::nullopt;
  int64_t value = -1;
  const char* begin = header->data();
  const char* end = begin + header->size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr != end || header->empty()) {
    return bad("bad_dp_rank", "X-data-parallel-rank '" + *header + "' is not an integer");
  }
  if (value < 0 || value >= static_cast<int64_t>(node.dp_size)) {
    return bad("bad_dp_rank", "data_parallel_rank " + std::to_string(value) +
                                  " is out of range [0, " + std::to_string(node.dp_size) + ")");
  }
  *rank = static_cast<uint32_t>(value);
  return std::nullopt;
}

// Hand-written equivalents of the connectors' request-id regexes (std::regex trips GCC 12's
// -Wmaybe-uninitialized under the sanitizers). Each returns false when the regex would not match.

constexpr std::string_view kPrefillTag = "___prefill_addr_";
constexpr std::string_view kDecodeTag = "___decode_addr_";

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_lower_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f'); }

// MoRIIO `___prefill_addr_(.+?)___decode_addr_`
bool moriio_prefill_address(std::string_view id, std::string* out) {
  for (size_t p = id.find(kPrefillTag); p != std::string_view::npos; p = id.find(kPrefillTag, p + 1)) {
    const size_t begin = p + kPrefillTag.size();
    const size_t end = id.find(kDecodeTag, begin + 1);
    if (end != std::string_view::npos) {
      *out = std::string(id.substr(begin, end - begin));
      return true;
    }
  }
  return false;
}

// MoRIIO `___decode_addr_(.+)_[0-9a-f]{32}(?:-.*)?$` (greedy capture).
bool moriio_decode_address(std::string_view id, std::string* out) {
  for (size_t p = id.find(kDecodeTag); p != std::string_view::npos; p = id.find(kDecodeTag, p + 1)) {
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

// P2P-NCCL `TAG(.*):(\d+)` followed by `suffix` (empty: anything may follow).
bool p2p_address(std::string_view id, std::string_view tag, std::string_view suffix,
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

// MoRIIO: explicit remote_host/remote_handshake_port/remote_notify_port win; otherwise the peer's
// zmq_address is parsed out of the request id with moriio_common.py's regexes.
std::optional<SimError> moriio_peer(const std::string& request_id,
                                    const json& params, bool prefill_leg, std::string* peer) {
  if (present(params, "remote_host") && present(params, "remote_handshake_port") &&
      present(params, "remote_notify_port")) {
    *peer = "host:" + scalar_text(params["remote_host"]) + ",handshake:" +
            scalar_text(params["remote_handshake_port"]) +
            ",notify:" + scalar_text(params["remote_notify_port"]);
    return std::nullopt;
  }
  std::string zmq;
  // The producer (prefill) extracts the decode's address, the consumer the prefill's.
  const bool found = prefill_leg ? moriio_decode_address(request_id, &zmq)
                                 : moriio_prefill_address(request_id, &zmq);
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
  *peer = address.to_string();
  return std::nullopt;
}

std::optional<SimError> check_moriio(const KvNodeIdentity& node, const std::string& request_id,
                                     KvRequest* out) {
  const json& params = out->params;
  if (!present(params, "transfer_id") || !params["transfer_id"].is_string()) {
    return bad("missing_transfer_id", "MoRIIO kv_transfer_params: missing 'transfer_id'");
  }
  out->transfer_id = params["transfer_id"].get<std::string>();
  if (auto e = moriio_peer(request_id, params, out->leg == KvLeg::kPrefill,
                           &out->peer_address)) {
    return e;
  }
  if (out->leg == KvLeg::kDecode && node.transfer_mode == proto::TransferMode::kRead) {
    return require(params, {"remote_block_ids", "remote_engine_id"}, "MoRIIO READ");
  }
  return std::nullopt;
}

std::optional<SimError> check_p2p_nccl(const std::string& request_id, KvRequest* out) {
  std::string prefill;
  std::string decode;
  if (!p2p_address(request_id, kPrefillTag, "___", &prefill) ||
      !p2p_address(request_id, kDecodeTag, "", &decode)) {
    return bad("bad_request_id",
               "P2P-NCCL: request id '" + request_id +
                   "' must carry ___prefill_addr_IP:PORT___decode_addr_IP:PORT");
  }
  out->peer_address = out->leg == KvLeg::kPrefill ? decode : prefill;
  return std::nullopt;
}

}  // namespace

std::optional<SimError> check_kv_request(const KvNodeIdentity& node, const std::string& request_id,
                                         const std::optional<std::string>& dp_rank_header,
                                         const json& kv_transfer_params, KvRequest* out) {
  if (auto e = parse_dp_rank(node, dp_rank_header, &out->dp_rank)) return e;
  if (!kv_transfer_params.is_null() && !kv_transfer_params.is_object()) {
    return bad("bad_kv_transfer_params", "kv_transfer_params must be an object");
  }
  out->params = kv_transfer_params;
  const bool remote_decode = truthy(kv_transfer_params, "do_remote_decode");
  const bool remote_prefill = truthy(kv_transfer_params, "do_remote_prefill");
  if (remote_decode && remote_prefill) {
    return bad("bad_kv_transfer_params", "do_remote_decode and do_remote_prefill are both true");
  }
  out->leg = remote_decode ? KvLeg::kPrefill : remote_prefill ? KvLeg::kDecode : KvLeg::kPlain;
  // P2P-NCCL and SGLang carry no kv_transfer_params: the node's role decides the leg.
  if (node.connector == Connector::kP2pNccl || node.connector == Connector::kSglang) {
    out->leg = node.role == Role::kPrefill ? KvLeg::kPrefill : KvLeg::kDecode;
  }
  if (out->leg == KvLeg::kPlain) return std::nullopt;
  const bool prefill_node = node.role == Role::kPrefill;
  if ((out->leg == KvLeg::kPrefill) != prefill_node) {
    return bad("role_mismatch", std::string("this simulated node is a ") +
                                    (prefill_node ? "prefill" : "decode") + " node but got a " +
                                    (out->leg == KvLeg::kPrefill ? "prefill" : "decode") + " leg");
  }
  switch (node.connector) {
    case Connector::kMoriio: return check_moriio(node, request_id, out);
    case Connector::kP2pNccl: return check_p2p_nccl(request_id, out);
    case Connector::kNixl:
      if (out->leg == KvLeg::kDecode) {
        if (auto e = require(kv_transfer_params,
                             {"remote_block_ids", "remote_engine_id", "remote_request_id",
                              "remote_host", "remote_port"},
                             "NIXL")) {
          return e;
        }
        out->peer_address = scalar_text(kv_transfer_params["remote_host"]) + ":" +
                            scalar_text(kv_transfer_params["remote_port"]);
      }
      return std::nullopt;
    case Connector::kMooncake:
      if (out->leg == KvLeg::kDecode) {
        if (auto e = require(kv_transfer_params,
                             {"remote_engine_id", "remote_bootstrap_addr", "transfer_id"},
                             "Mooncake")) {
          return e;
        }
        out->peer_address = scalar_text(kv_transfer_params["remote_bootstrap_addr"]);
      }
      // A prefill without transfer_id only logs a warning in vLLM; the transfer just never pairs.
      if (present(kv_transfer_params, "transfer_id") && kv_transfer_params["transfer_id"].is_string()) {
        out->transfer_id = kv_transfer_params["transfer_id"].get<std::string>();
      }
      return std::nullopt;
    case Connector::kSglang:
    case Connector::kUnknown: return std::nullopt;
  }
  return std::nullopt;
}

std::vector<int64_t> synthetic_block_ids(const std::string& request_id, uint32_t prompt_tokens) {
  uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : request_id) hash = (hash ^ c) * 1099511628211ULL;
  const int64_t first = static_cast<int64_t>(hash % 100000) * 8;
  const uint32_t count = (prompt_tokens + kTokensPerBlock - 1) / kTokensPerBlock;
  std::vector<int64_t> ids;
  for (uint32_t i = 0; i < count; ++i) ids.push_back(first + i);
  return ids;
}

uint32_t kv_block_count(uint32_t prompt_tokens) {
  return (prompt_tokens + kTokensPerBlock - 1) / kTokensPerBlock;
}

std::string sglang_peer_address(const json& body) {
  if (!body.is_object() || !present(body, "bootstrap_host") || !present(body, "bootstrap_port")) {
    return "";
  }
  const std::string host = scalar_text(body["bootstrap_host"]);
  // An IPv6 host comes bracketed already (REQUEST_LEGS.md, SGLang).
  return host + ":" + scalar_text(body["bootstrap_port"]);
}

json prefill_response_params(const KvNodeIdentity& node, const KvRequest& request,
                             const std::string& internal_id, const std::vector<int64_t>& blocks) {
  if (request.leg != KvLeg::kPrefill) return nullptr;
  switch (node.connector) {
    case Connector::kNixl:
      return json{{"do_remote_prefill", true},
                  {"do_remote_decode", false},
                  {"remote_block_ids", blocks},
                  {"remote_engine_id", node.engine_id},
                  {"remote_request_id", internal_id},
                  {"remote_host", node.advertise_host},
                  {"remote_port", node.kv_port + request.dp_rank},
                  {"tp_size", node.tp_size}};
    case Connector::kMoriio:
      return json{{"do_remote_prefill", true},
                  {"do_remote_decode", false},
                  {"remote_block_ids", blocks},
                  {"remote_engine_id",
                   node.advertise_host + ":" + std::to_string(node.handshake_port)},
                  {"remote_host", node.advertise_host},
                  {"remote_handshake_port", node.handshake_port},
                  {"remote_notify_port", node.notify_port},
                  {"remote_dp_size", node.dp_size},
                  {"tp_size", node.tp_size},
                  {"transfer_id", request.transfer_id}};
    default: return nullptr;
  }
}

}  // namespace pdr::node::sim
