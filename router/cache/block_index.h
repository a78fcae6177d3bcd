// Which node holds which KV cache blocks, learnt from the nodes' KV cache events
// (proto/kv_events.h), and which node holds the longest prefix of a request's token ids.
//
// Keys are the router's own hashes, not the engine's: block i of a token sequence hashes to
//   h(i) = XXH64(little-endian u32 token ids of block i, seed = h(i-1)),   h(-1) = chain seed
// where the chain seed is XXH64 of the LoRA name (0 without one). So the engine's hash
// algorithm, its seed and PYTHONHASHSEED need not be reproduced (API_FACTS.md 2.3-2.5, the
// dual-key scheme of llm-d and Dynamo); engine hashes are kept per holder only to find a stored
// event's parent and to apply removals.
//
// Holders: one per (node, DP rank), since each DP rank has its own cache and removes blocks
// independently; a lookup answers per node (its best rank). Nodes are named by the caller's key
// (the instance's HTTP address).
//
// What is not indexed (counted in Stats): blocks of an event with extra keys (multimodal
// inputs, cache_salt, prompt embeddings: their tokens do not identify their content); an event
// whose parent block is unknown here (stored before we subscribed, or evicted) or whose token
// count is not block_size per block. Either way the index under-reports, which costs only cache
// affinity, never correctness: the engine decides what it really reuses.
//
// Memory: at most `max_entries` (holder, block) entries; beyond it the least recently stored
// ones are dropped (a re-stored block counts as new). Each entry costs about 100 bytes.
//
// Threading: thread-safe. Updates (one subscriber thread) take an exclusive lock, lookups (any
// HTTP worker) a shared one; a lookup costs one hash per prompt block plus one map probe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "proto/kv_events.h"

namespace pdr::router::cache {

using RouterHash = uint64_t;

// The router's chained hash of each full block of `tokens` (a trailing partial block has none).
std::vector<RouterHash> chain_hashes(std::span<const uint32_t> tokens, uint32_t block_size,
                                     std::optional<std::string_view> lora_name = std::nullopt);

struct PrefixMatch {
  std::string node;          // the node's key
  uint32_t matched_blocks = 0;  // leading blocks of the request the node holds
  uint32_t block_size = 0;
};

class BlockIndex {
 public:
  struct Stats {
    uint64_t entries = 0;            // (holder, block) pairs held now
    uint64_t blocks_stored = 0;      // indexed from BlockStored events
    uint64_t blocks_removed = 0;     // dropped by BlockRemoved / AllBlocksCleared
    uint64_t blocks_evicted = 0;     // dropped by the memory budget
    uint64_t blocks_skipped = 0;     // not indexed: extra keys, unknown parent, bad token count
  };

  explicit BlockIndex(size_t max_entries = 4'000'000);

  // Applies one decoded batch from `node`'s publisher for `dp_rank` (0 when the batch names none).
  void apply(std::string_view node, uint32_t dp_rank, const proto::KvEventBatch& batch);
  // Forgets everything one node holds, every DP rank (restart, expiry, removal).
  void drop_node(std::string_view node);
  // Forgets what one DP rank of a node holds (that rank's gap without replay, undecodable batch or
  // publisher restart): its other ranks' publishers are separate streams and stay exact.
  void drop_rank(std::string_view node, uint32_t dp_rank);

  // Per node that holds at least the first block of `tokens`, how many leading blocks it holds;
  // longest first (ties by key). Nodes with another block size are matched with their own.
  std::vector<PrefixMatch> longest_prefix(std::span<const uint32_t> tokens,
                                          std::optional<std::string_view> lora_name = std::nullopt) const;

  Stats stats() const;
  // Stats of one node (entries summed over its ranks); zeros for an unknown node.
  Stats node_stats(std::string_view node) const;
  // Holder slots allocated (live (node, rank) holders plus freed slots awaiting reuse): bounded by
  // the most holders ever live at once, however many nodes come and go.
  size_t holder_slots() const;

 private:
  using HolderId = uint32_t;
  struct Holder {
    std::string node;
    uint32_t dp_rank = 0;
    uint32_t block_size = 0;  // from its latest BlockStored
    struct Entry {
      RouterHash hash;
      uint64_t generation;  // matches the budget FIFO's record of its latest store
    };
    std::unordered_map<proto::EngineHash, Entry> blocks;  // by engine hash
    uint64_t stored = 0, removed = 0, evicted = 0, skipped = 0;
  };
  struct Holding {  // one holder of a router hash; count > 1 when KV cache groups repeat a block
    HolderId holder;
    uint32_t count;
  };
  struct Stored {  // one entry of the budget's FIFO
    HolderId holder;
    proto::EngineHash engine;
    uint64_t generation;
  };

  HolderId holder_for(std::string_view node, uint32_t dp_rank);
  void store(HolderId id, const proto::KvEvent& event);
  void remove(HolderId id, proto::EngineHash engine);
  void link(HolderId id, RouterHash hash);
  void unlink(HolderId id, RouterHash hash);
  void enforce_budget();
  void compact_order();
  // Drops the holders of `node` (all ranks, or only `dp_rank`); caller holds mu_ exclusively.
  void drop_holders(std::string_view node, std::optional<uint32_t> dp_rank);

  const size_t max_entries_;
  mutable std::shared_mutex mu_;
  std::vector<std::optional<Holder>> holders_;            // by HolderId; nullopt once dropped
  // Dropped slots, reused by the next new holder. Safe because every budget record carries the
  // generation of its store and generations are unique across holders: a record left by a slot's
  // previous holder never matches an entry of the next one, so it is skipped as stale.
  std::vector<HolderId> free_ids_;
  std::map<std::pair<std::string, uint32_t>, HolderId, std::less<>> holder_ids_;
  // router hash -> holders that hold it (usually one or two: a short vector beats a set).
  std::unordered_map<RouterHash, std::vector<Holding>> holders_of_;
  // Store order, for the budget. Records of blocks since removed or stored again stay until
  // they reach the front or compact_order() drops them (when they outnumber live entries).
  std::deque<Stored> order_;
  uint64_t next_generation_ = 1;
  uint64_t entries_ = 0;
  Stats totals_;
};

}  // namespace pdr::router::cache
