// EngineKvMover: the KvMover (node/sim/kv.h) that moves real KV bytes between `pdnode sim` nodes
// with the transfer engine (transfer/engine.h), for every connector dialect.
//
// Each node owns an Engine with one memfd region cut into `blocks` blocks x `layers` layers of
// `block_bytes` (layer-major layout), and a free list (KvBlockPool). Every node serves the KV side
// channel (node/sim/kv_channel.h, messages in node/sim/kv_wire.h) on the ports its dialect
// advertises (SimDialect::side_channel, node/sim/dialect.h); a decode's contacts its prefill's
// where the real connector would (SimDialect::resolve_peer, via node/sim/kv_peer.h). A decode's
// own side channel only describes itself (its advertised address is real, as a real decode's
// listener is). Port 0 binds an ephemeral port and create() writes every bound port back into the
// node identity, so that is what gets advertised.
//
// A request's KV is identified by its transfer key (kv_transfer_key()) and its bytes are
// synthetic (node/sim/kv_content.h), so the decode verifies every byte.
//
// Prefill: export_prefill_blocks() allocates the prompt's blocks, fills them and holds them under
// the key for at most `hold` (then they are reaped and counted: nobody pulled them).
// SimDialect::movement says which of two ways the KV moves:
// READ dialects (kPull: NIXL, MoRIIO READ): the decode fetches (and caches per address) the
//   prefill's descriptor, READs the prefill's remote_block_ids into blocks of its own with
//   notify = key, and verifies; the notification makes the prefill free its blocks.
// WRITE dialects (kPush: MoRIIO WRITE, P2P-NCCL, Mooncake, SGLang): the decode allocates blocks and
//   sends kWriteRequest{key, its descriptor, its block ids} to the prefill; the prefill WRITEs its
//   blocks there with notify = key as soon as both its leg has finished and the request is there
//   (either may come first), then frees its blocks; the decode waits for the notification (until
//   `transfer_timeout`) and verifies.
// Bidirectional NIXL (--bidirectional-kv-xfer): a decode exports the blocks it keeps for a
//   conversation's next turn with export_prefill_blocks(), and that turn's prefill pulls them with
//   import_decode_blocks(), both as above with the roles swapped (the puller's READ notification
//   frees the decode's blocks).
// The decode frees its blocks at end_decode(). Blocks that a late WRITE may still land in (the
// decode gave up waiting) are quarantined for `hold` instead of being reused at once.
//
// Errors fail the decode request: kv_timeout (504), kv_peer_unreachable (502), kv_pool_full (503),
// kv_transfer_failed (502), kv_mismatch (500, naming the block, layer and byte).
//
// Threads: blocking work (side-channel calls, transfer waits, verification) runs on a pool of
// `io_threads` threads; the side channel, READ notifications and reaping on the channel thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "node/sim/kv.h"
#include "proto/base/status.h"

namespace pdr::node::sim {

struct EngineKvMoverOptions {
  KvNodeIdentity node;  // role, connector and mode (its dialect), advertise host, KV ports
  std::string bind_host = "127.0.0.1";  // the side channel's and the tcp backend's listen host
  std::string backends = "tcp";      // transfer::parse_backend_list()
  uint32_t blocks = 2048;
  uint32_t block_bytes = 16384;
  uint32_t layers = 2;
  std::chrono::milliseconds hold{60000};
  std::chrono::milliseconds transfer_timeout{30000};
  uint32_t io_threads = 32;
};

class EngineKvMover final : public KvMover {
 public:
  static Status create(EngineKvMoverOptions options, std::unique_ptr<EngineKvMover>* out);
  ~EngineKvMover() override;

  // The node identity with the bound side-channel ports filled in.
  const KvNodeIdentity& node() const;
  std::string engine_agent() const;

  std::optional<SimError> export_prefill_blocks(const KvBlocks& blocks,
                                                std::vector<int64_t>* block_ids) override;
  uint64_t import_decode_blocks(const KvBlocks& blocks, ImportDone done) override;
  void end_decode(uint64_t lease) override;
  void set_export_released(ExportReleased fn) override;
  nlohmann::json stats() const override;
  void stop() override;

  struct Impl;

 private:
  explicit EngineKvMover(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdr::node::sim
