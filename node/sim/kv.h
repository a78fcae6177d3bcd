// kv_transfer_params and P/D headers for `pdnode sim`: the generic part. What each connector
// dialect checks, answers and advertises lives in its own file (node/sim/dialect.h,
// node/sim/dialects/). Pure functions over JSON; no I/O.
//
// check_kv_request() decides which leg a request is (plain, prefill or decode) and refuses what
// the real connector would refuse (a KeyError or "invalid KVTransferParams" in vLLM becomes a
// 400 here, so misbehaving routers fail loudly in tests). A node refuses a leg that contradicts
// its --role. A finished prefill answers its dialect's SimDialect::prefill_answer.
//
// KvMover is the seam where KV bytes move: the server calls export_prefill_blocks() when a prefill
// leg finishes and import_decode_blocks() when a decode leg arrives; the decode emits its first
// token once the import is done. NullKvMover (--kv-backends none) moves nothing and accepts
// everything; EngineKvMover (node/sim/kv_mover.h) moves real bytes with the transfer engine.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim/error.h"
#include "proto/discovery_message.h"

namespace pdr::node::sim {

struct SimDialect;

// What this node is, as far as KV transfer is concerned. connector + transfer_mode name its
// dialect (find_sim_dialect()); the ports are those the dialects advertise.
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

// `dialect` is the node's (find_sim_dialect(node)). `dp_rank_header` is the X-data-parallel-rank
// value, if sent; `request_id` the X-Request-Id (or the generated id when absent); `body` the
// request body (its kv_transfer_params, and what else the dialect reads).
std::optional<SimError> check_kv_request(const SimDialect& dialect, const KvNodeIdentity& node,
                                         const std::string& request_id,
                                         const std::optional<std::string>& dp_rank_header,
                                         const nlohmann::json& body, KvRequest* out);

// The synthetic KV blocks one request owns: 16 tokens per block, ids derived from the request id.
std::vector<int64_t> synthetic_block_ids(const std::string& request_id, uint32_t prompt_tokens);

struct KvBlocks {
  std::string request_id;        // X-Request-Id
  std::string transfer_id;
  std::string peer_address;
  std::vector<int64_t> block_ids;  // decode: the prefill's remote_block_ids, when the dialect has them
  uint32_t prompt_tokens = 0;
  uint32_t dp_rank = 0;
  std::string prompt;            // the prompt text (seeds the synthetic KV content)
  nlohmann::json params;         // the leg's kv_transfer_params (null if none)
};

// The id both legs of one request know: the dialect's transfer_id when it has one, else the
// X-Request-Id (the router sends the same one to both legs; proto/REQUEST_LEGS.md).
inline const std::string& kv_transfer_key(const KvBlocks& blocks) {
  return blocks.transfer_id.empty() ? blocks.request_id : blocks.transfer_id;
}

// Tokens per synthetic KV block, and the number of blocks a prompt occupies.
inline constexpr uint32_t kKvBlockTokens = 16;
uint32_t kv_block_count(uint32_t prompt_tokens);

// Threads: export_prefill_blocks() and import_decode_blocks() are called on the worker thread
// that owns the request, end_decode() likewise, several workers at once.
class KvMover {
 public:
  using ImportDone = std::function<void(std::optional<SimError>)>;

  virtual ~KvMover() = default;
  // A prefill leg finished. On success *block_ids (empty on entry) names the blocks holding its
  // KV; they become remote_block_ids. A mover that holds nothing leaves it empty (the server then
  // uses synthetic_block_ids()). A returned error fails the prefill's kv_transfer_params.
  virtual std::optional<SimError> export_prefill_blocks(const KvBlocks& blocks,
                                                        std::vector<int64_t>* block_ids) = 0;
  // A decode leg arrived: bring its prompt's KV in. `done` runs exactly once, on any thread
  // (possibly before this returns); an error fails the request with it. Returns a lease (0: none)
  // that the server passes to end_decode() when the leg ends (answered, failed or aborted),
  // whether or not `done` has run yet; the decode's blocks are freed then.
  virtual uint64_t import_decode_blocks(const KvBlocks& blocks, ImportDone done) = 0;
  virtual void end_decode(uint64_t /*lease*/) {}
  // `fn` runs (on any thread) with a transfer key once the blocks export_prefill_blocks() holds
  // under it are gone: read or written by the decode, or reaped unread. Set before any export. A
  // mover that holds nothing (export left block_ids empty) never calls it.
  using ExportReleased = std::function<void(const std::string& key)>;
  virtual void set_export_released(ExportReleased /*fn*/) {}
  // GET /sim/kv.
  virtual nlohmann::json stats() const { return nlohmann::json{{"kv_backends", "none"}}; }
  // Stops background work (from the owning thread, before the server's workers stop); every
  // pending `done` has run when it returns.
  virtual void stop() {}
};

class NullKvMover final : public KvMover {
 public:
  std::optional<SimError> export_prefill_blocks(const KvBlocks&, std::vector<int64_t>*) override {
    return std::nullopt;
  }
  uint64_t import_decode_blocks(const KvBlocks&, ImportDone done) override {
    done(std::nullopt);
    return 0;
  }
};

}  // namespace pdr::node::sim
