#include "node/sim/kv.h"

#include <charconv>

#include "node/sim/dialect.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;
using proto::Role;

constexpr uint32_t kTokensPerBlock = kKvBlockTokens;

SimError bad(std::string reason, std::string message) {
  return SimError{400, std::move(reason), std::move(message)};
}

bool truthy(const json& params, const char* key) {
  return params.is_object() && params.contains(key) && params[key].is_boolean() &&
         params[key].get<bool>();
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

}  // namespace

std::optional<SimError> check_kv_request(const SimDialect& dialect, const KvNodeIdentity& node,
                                         const std::string& request_id,
                                         const std::optional<std::string>& dp_rank_header,
                                         const json& body, KvRequest* out) {
  const json kv_transfer_params =
      body.contains("kv_transfer_params") ? body["kv_transfer_params"] : json();
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
  // Dialects without kv_transfer_params: the node's role decides the leg.
  if (dialect.leg_from_role) {
    out->leg = node.role == Role::kPrefill ? KvLeg::kPrefill : KvLeg::kDecode;
  }
  if (out->leg == KvLeg::kPlain) return std::nullopt;
  const bool prefill_node = node.role == Role::kPrefill;
  if ((out->leg == KvLeg::kPrefill) != prefill_node) {
    return bad("role_mismatch", std::string("this simulated node is a ") +
                                    (prefill_node ? "prefill" : "decode") + " node but got a " +
                                    (out->leg == KvLeg::kPrefill ? "prefill" : "decode") + " leg");
  }
  return dialect.check_leg(node, request_id, body, out);
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

}  // namespace pdr::node::sim
