// kv_transfer_params and P/D headers for `pdnode sim`, per connector dialect (shared/PROTOCOLS.md
// §1.4 MoRIIO, §2 P2P-NCCL, §3 NIXL, §4 Mooncake, §7 SGLang). Pure functions over JSON; no I/O.
//
// check_kv_request() decides which leg a request is (plain, prefill or decode) and refuses what
// the real connector would refuse (a KeyError or "invalid KVTransferParams" in vLLM becomes a
// 400 here, so misbehaving routers fail loudly in tests). prefill_response_params() builds what
// the prefill's request_finished() returns. A node refuses a leg that contradicts its --role.
//
// KvMover is the seam where real KV bytes will move: the server calls export_prefill_blocks()
// when a prefill leg finishes and import_decode_blocks() before a decode leg emits its first
// token. Today's NullKvMover moves nothing and accepts everything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim_error.h"
#include "proto/discovery_message.h"

namespace pdr::node::sim {

// What this node is, as far as KV transfer is concerned.
struct KvNodeIdentity {
  proto::Role role = proto::Role::kPrefill;
  proto::Connector connector = proto::Connector::kNixl;
  proto::TransferMode transfer_mode = proto::TransferMode::kNone;  // MoRIIO: READ or WRITE
  std::string advertise_host = "127.0.0.1";
  uint16_t http_port = 0;
  uint16_t handshake_port = 6301;  // MoRIIO
  uint16_t notify_port = 61005;    // MoRIIO
  uint16_t kv_port = 5600;         // NIXL side channel / P2P-NCCL / Mooncake worker base port
  uint32_t dp_size = 1;
  uint32_t tp_size = 1;
  std::string engine_id;           // NIXL / Mooncake engine id (MoRIIO derives "host:handshake")
};

enum class KvLeg { kPlain, kPrefill, kDecode };

// A validated request, as the connector understood it.
struct KvRequest {
  KvLeg leg = KvLeg::kPlain;
  nlohmann::json params;      // the request's kv_transfer_params (null if absent)
  std::string transfer_id;    // MoRIIO / Mooncake
  std::string peer_address;   // the peer's KV address the connector would contact, if known
  uint32_t dp_rank = 0;       // from X-data-parallel-rank (0 when absent)
};

// `dp_rank_header` is the X-data-parallel-rank value, if sent; `request_id` the X-Request-Id (or
// the generated id when absent).
std::optional<SimError> check_kv_request(const KvNodeIdentity& node, const std::string& request_id,
                                         const std::optional<std::string>& dp_rank_header,
                                         const nlohmann::json& kv_transfer_params, KvRequest* out);

// The prefill's kv_transfer_params in its non-streaming response (null for Mooncake, P2P-NCCL,
// SGLang, and for plain or decode legs). `internal_id` is the engine-internal request id.
nlohmann::json prefill_response_params(const KvNodeIdentity& node, const KvRequest& request,
                                       const std::string& internal_id, uint32_t prompt_tokens);

// The synthetic KV blocks one request owns: 16 tokens per block, ids derived from the request id.
std::vector<int64_t> synthetic_block_ids(const std::string& request_id, uint32_t prompt_tokens);

struct KvBlocks {
  std::string request_id;        // X-Request-Id
  std::string transfer_id;
  std::string peer_address;
  std::vector<int64_t> block_ids;
  uint32_t prompt_tokens = 0;
  uint32_t dp_rank = 0;
};

// Called on the worker thread that owns the request. A returned error fails the request with it.
class KvMover {
 public:
  virtual ~KvMover() = default;
  virtual std::optional<SimError> export_prefill_blocks(const KvBlocks& blocks) = 0;
  virtual std::optional<SimError> import_decode_blocks(const KvBlocks& blocks) = 0;
};

class NullKvMover final : public KvMover {
 public:
  std::optional<SimError> export_prefill_blocks(const KvBlocks&) override { return std::nullopt; }
  std::optional<SimError> import_decode_blocks(const KvBlocks&) override { return std::nullopt; }
};

}  // namespace pdr::node::sim
