// Helpers the dialect files in node/sim/dialects/ share (not for the generic simulator): reading
// kv_transfer_params, the router's request-id address tags (MoRIIO, P2P-NCCL), the pdrouter
// registration format (dialects without a discovery of their own), and the plain host:port peer.
#pragma once

#include <chrono>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim/dialect.h"

namespace pdr::node::sim::dialect {

// A 400 with `reason`, as vLLM's KeyError / "invalid KVTransferParams" would fail the request.
SimError bad(std::string reason, std::string message);

// A JSON scalar as text: strings without their quotes, anything else as JSON.
std::string scalar_text(const nlohmann::json& value);

// `key` is there and not null.
bool present(const nlohmann::json& params, const char* key);

// Each key must be present(); the first missing one is a 400 "missing_KEY" naming `dialect`.
std::optional<SimError> require(const nlohmann::json& params,
                                std::initializer_list<const char*> keys,
                                const std::string& dialect);

// The router embeds both legs' KV addresses in the request id (proto/REQUEST_LEGS.md).
inline constexpr std::string_view kPrefillTag = "___prefill_addr_";
inline constexpr std::string_view kDecodeTag = "___decode_addr_";

inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_lower_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f'); }

// No kv_transfer_params in the prefill's answer.
nlohmann::json no_prefill_answer(const KvNodeIdentity& node, const KvRequest& request,
                                 const std::string& internal_id,
                                 const std::vector<int64_t>& blocks);

// One side-channel port, node.kv_port.
std::vector<SidePortRange> one_kv_port(const KvNodeIdentity& node);

// blocks.peer_address is HOST:PORT of the prefill's side channel.
std::optional<SimError> host_port_peer(const KvBlocks& blocks,
                                       std::chrono::steady_clock::time_point deadline,
                                       proto::HostPort* out);

// The pdrouter registration format (schema 1, dp/tp sizes, model), for dialects whose real nodes
// have no discovery of their own.
void pdrouter_registration(const SimRegistrationInputs& in, proto::Registration* reg);

}  // namespace pdr::node::sim::dialect
