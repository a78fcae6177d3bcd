// Which node holds which KV cache blocks, learnt from the nodes' KV cache events
// (proto/kv_events.h), and which node holds the longest prefix of a request's token ids.
//
// Keys are the router's own hashes, not the engine's: block i of a token sequence hashes to
//   h(i) = XXH64(little-endian u32 token ids of block i, seed = s(i)),
//   s(i) = h(i-1), or XXH64(block i's extra keys, seed = h(i-1)) when it has any,
//   h(-1) = chain seed
// where the chain seed is XXH64 of the LoRA name (0 without one). So the engine's hash
// algorithm, its seed and PYTHONHASHSEED need not be reproduced (docs/design/kv-events.md, "How vLLM hashes blocks", the
// dual-key scheme of llm-d and Dynamo); engine hashes are kept per holder only to find a stored
// event's parent, to apply removals and to name tokenless offload stores.
//
// What makes two blocks the same block, as in vLLM's own hash (vllm/v1/core/kv_cache_utils.py):
//   - LoRA: the adapter's name seeds the chain, so blocks of different adapters (and of the base
//     model) never match one another; a request for adapter X matches only X's blocks
//     (cache_routing.h tells adapter names from base model names with knows_lora()). A block
//     whose adapter the event names only by lora_id (older vLLM) is not indexed: no request can
//     name that adapter's blocks by id.
//   - Extra keys (KvEvent::extra_keys: multimodal identifiers, cache_salt, prompt-embedding
//     digests; the adapter's own key is left out, the chain seed carries it) enter the block's
//     seed, so a block whose extra keys differ is a different block, and so is everything chained
//     after it. A token-id request has no multimodal identifiers: blocks that have them never
//     match it (the blocks before the first of them do: their content is plain tokens). A request's
//     cache_salt is the first block's extra keys (longest_prefix's first_block_extra).
//   - KV cache groups (hybrid models: KvEvent::group_idx and kv_cache_spec_kind): only groups
//     that give prefix hits by themselves are indexed: full attention ("full_attention",
//     "mla_attention", "sink_full_attention"; without a kind, older vLLM: a group without a
//     sliding window). Sliding-window, chunked-local, Mamba/recurrent and other groups keep only
//     a window or a state of the sequence, not its prefix: their stores are not indexed (counted
//     in blocks_ignored) and their removals touch nothing, since each group's blocks are held
//     apart (a sliding-window group removing a block it slid past leaves the full-attention copy
//     of that block alone). A group without group_idx is group 0. A rank with several
//     full-attention groups holds a prefix as far as all of them do (vLLM needs a hit in each).
//   - Tiers (KvEvent::medium, locality): each tier of a group is held apart, so a block in two
//     tiers is removed from one only by that tier's BlockRemoved, and is counted once: the GPU
//     (no medium: older vLLM, which publishes the GPU pool only) and a node-local CPU offload tier
//     are indexed; other media ("STORAGE", a remote locality) are not (counted in
//     blocks_ignored): a shared or remote store is no reason to prefer one node over another, and
//     its cost to load is unknown. CPU-tier stores are reference counted (the offloading
//     connector may announce one block once per chunk holding it and removes it as often); a
//     tokenless CPU store (the connector's placeholder, block_size 0) is named by the rank's GPU
//     entry of the same engine hash when there is one, else skipped.
//   - A lookup (PrefixMatch) says how many leading blocks each node holds in any indexed tier and
//     how many of those are on its GPU; cached_tokens() weighs CPU-only blocks at
//     kOffloadWeightPercent, since the node still has to copy them in (see docs/endpoints.md).
//
// Memory: at most `max_entries` (holder, block) entries; beyond it the least recently stored
// ones are dropped (a re-stored block counts as new). An entry costs about 135 bytes of heap
// (glibc malloc, chunk headers included): a 64-byte node and ~11 bytes of buckets in its holder's
// map, and when no other holder has the block a 48-byte node and ~11 bytes of buckets in
// holders_of_ (shared blocks share those: about 120 bytes an entry when two nodes hold the same
// blocks). Measured by bench/router/block_index_bench.cc (bench/router/BLOCK_INDEX_RESULTS.md).
//
// Threading: thread-safe. Writers (apply, drop_node, drop_rank: the subscriber thread) run one
// at a time and take the exclusive lock in slices; lookups (longest_prefix on any HTTP worker)
// and stats take the shared lock. The lock prefers writers (proto/base/writer_first_shared_mutex.h), so
// a stream of lookups cannot hold a writer off either.
//
// A node chooses its engine block hashes, and steers the router hashes through its token ids:
//   - both maps hash keys with a per-process secret key (SipHash-2-4, proto/base/keyed_hash.h): no
//     choice of keys piles them into one bucket, so each insert costs O(1) expected (keyed by the
//     plain value, 172,933 crafted hashes held the exclusive lock for over a minute);
//   - each map is split 64 ways (sharded_hash_map.h): growing a bucket array relinks one shard,
//     never the whole map;
//   - a batch is applied in slices: per exclusive-lock hold at most kSliceBlocks block
//     operations (stores, removals, evictions, entries of a clear), kSliceTokens token ids hashed
//     and kSliceRehash elements relinked by growth (or the growth of one shard alone). Between
//     slices the lock is free and waiting lookups run. A lookup sees a batch not at all, whole,
//     or cut between two block operations (a state the engine could have published as two
//     batches); all of a batch's effects land, in order, before apply() returns. The budget
//     holds at every release;
//   - a dropped holder (drop_node, drop_rank) disappears from lookups and node_stats in one short
//     hold, then its entries are erased in slices of kSliceBlocks and its emptied tables freed
//     with no lock held.
// So a lookup waits for at most the lookups ahead of it and one slice, whatever the node sends:
// on the 2-core development machine under a load average of 10 to 14, the longest hold was
// 11.4 ms of CPU time (4,096 stores into a 1M-entry index), 5.3 ms for the crafted hashes and
// 7.6 ms while dropping a 1M-entry node (bench/router/BLOCK_INDEX_RESULTS.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "proto/base/writer_first_shared_mutex.h"
#include "proto/kv_events.h"
#include "router/cache/sharded_hash_map.h"

namespace pdr::router::cache {

using RouterHash = uint64_t;

// The router's chained hash of each full block of `tokens` (a trailing partial block has none).
// `first_block_extra`: the first block's extra keys in canonical form (proto::kv_extra_keys_for_*),
// empty for none.
std::vector<RouterHash> chain_hashes(std::span<const uint32_t> tokens, uint32_t block_size,
                                     std::optional<std::string_view> lora_name = std::nullopt,
                                     std::string_view first_block_extra = {});

// CPU-tier blocks count this much of a GPU block in PrefixMatch::cached_tokens().
inline constexpr uint32_t kOffloadWeightPercent = 50;

struct PrefixMatch {
  std::string node;             // the node's key
  uint32_t matched_blocks = 0;  // leading blocks of the request the node holds, GPU or CPU tier
  uint32_t gpu_blocks = 0;      // how many of those leading blocks are on its GPU
  uint32_t block_size = 0;

  // The tokens this match is worth to routing: GPU blocks in full, the CPU-only blocks after
  // them at kOffloadWeightPercent.
  uint64_t cached_tokens() const {
    return uint64_t{gpu_blocks} * block_size +
           uint64_t{matched_blocks - gpu_blocks} * block_size * kOffloadWeightPercent / 100;
  }
};

class BlockIndex {
 public:
  struct Stats {
    uint64_t entries = 0;            // (holder, block) pairs held now
    uint64_t blocks_stored = 0;      // indexed from BlockStored events
    uint64_t blocks_removed = 0;     // dropped by BlockRemoved / AllBlocksCleared
    uint64_t blocks_evicted = 0;     // dropped by the memory budget
    uint64_t blocks_skipped = 0;     // not indexed: unknown parent, bad token count, ... (above)
    uint64_t blocks_ignored = 0;     // not indexed by design: other KV cache groups or tiers
  };

  // Per exclusive-lock hold of a writer: block operations (a store, removal or eviction of one
  // block, or one entry of a clear or drop), token ids hashed for stored blocks, and elements
  // relinked by growing the maps' bucket arrays (a hold that has done nothing else may grow one
  // shard of any size, then ends).
  static constexpr size_t kSliceBlocks = 4096;
  static constexpr size_t kSliceTokens = size_t{1} << 18;
  static constexpr size_t kSliceRehash = 16384;
  // Full-attention groups indexed per (node, DP rank); a further group's blocks are skipped.
  static constexpr size_t kMaxGroupsPerRank = 16;
  // Adapter names remembered for knows_lora(); further names are not (see knows_lora).
  static constexpr size_t kMaxLoraNames = 4096;

  explicit BlockIndex(size_t max_entries = 4'000'000);
  ~BlockIndex();
  BlockIndex(const BlockIndex&) = delete;
  BlockIndex& operator=(const BlockIndex&) = delete;

  // Applies one decoded batch from `node`'s publisher for `dp_rank` (0 when the batch names none).
  void apply(std::string_view node, uint32_t dp_rank, const proto::KvEventBatch& batch);
  // Forgets everything one node holds, every DP rank (restart, expiry, removal).
  void drop_node(std::string_view node);
  // Forgets what one DP rank of a node holds (that rank's gap without replay, undecodable batch or
  // publisher restart): its other ranks' publishers are separate streams and stay exact.
  void drop_rank(std::string_view node, uint32_t dp_rank);

  // Per node that holds at least the first block of `tokens`, how many leading blocks it holds
  // (PrefixMatch); most cached_tokens() first (ties by key). Nodes with another block size are
  // matched with their own. `lora_name`: the adapter's blocks (none: the base model's);
  // `first_block_extra`: the request's first-block extra keys (chain_hashes).
  // Costs one XXH64 per prompt block and one probe of the keyed map per block matched.
  std::vector<PrefixMatch> longest_prefix(std::span<const uint32_t> tokens,
                                          std::optional<std::string_view> lora_name = std::nullopt,
                                          std::string_view first_block_extra = {}) const;
  // Whether some node's events named `name` as a LoRA adapter (lora_name). The first
  // kMaxLoraNames names are remembered for the index's life (a name stays an adapter's name
  // when its blocks go); later ones are not, and answer false.
  bool knows_lora(std::string_view name) const;

  Stats stats() const;
  // Stats of one node (entries summed over its ranks); zeros for an unknown node.
  Stats node_stats(std::string_view node) const;
  // Holder slots allocated (live (node, rank) holders plus freed slots awaiting reuse): bounded by
  // the most holders ever live at once, however many nodes come and go.
  size_t holder_slots() const;

  // Tests only: called on the writing thread after each exclusive-lock hold of a writer, with no
  // lock held (so it may call longest_prefix or stats, or let another thread do so). Set before
  // any writer runs.
  void set_slice_hook_for_testing(std::function<void()> hook) { slice_hook_ = std::move(hook); }

 private:
  using HolderId = uint32_t;
  enum class Tier : uint8_t { kGpu, kCpu };
  struct Entry;
  using Block = std::pair<const proto::EngineHash, Entry>;  // an element of a holder's blocks
  struct Entry {
    RouterHash hash;
    // The budget's store order, least recently stored first: an intrusive list through the
    // elements of every holder's map (elements never move, see sharded_hash_map.h).
    Block* older = nullptr;
    Block* newer = nullptr;
    HolderId holder;
    uint16_t copies = 1;  // CPU tier: stores not yet matched by a removal (saturates)
  };
  struct Rank;
  struct Holder {
    std::string node;
    uint32_t dp_rank = 0;
    uint32_t group = 0;
    Tier tier = Tier::kGpu;
    Rank* rank = nullptr;     // its (node, DP rank); null once dropping
    uint32_t block_size = 0;  // from its latest BlockStored with tokens (0: none yet)
    bool dropping = false;    // dropped: invisible to lookups while its entries are erased
    ShardedHashMap<Entry> blocks;  // by engine hash
    uint64_t stored = 0, removed = 0, evicted = 0, skipped = 0;
  };
  // One (node, DP rank): its holders, what it said of its groups, what had no holder.
  struct Rank {
    std::vector<HolderId> holders;  // at most kMaxGroupsPerRank groups x 2 tiers
    // Groups whose kv_cache_spec_kind was seen: (group, gives prefix hits); at most 64.
    std::vector<std::pair<uint32_t, bool>> group_kinds;
    uint64_t skipped = 0, ignored = 0;  // blocks that found no holder (over the group cap / by design)
  };
  struct Holding {  // one holder of a router hash; count > 1 when its engine hashes repeat a block
    HolderId holder;
    uint32_t count;
  };
  // The holders of one router hash: usually one, kept inline (no allocation of its own).
  struct Holdings {
    Holding first{0, 0};  // count 0: none (only while being emptied)
    // The others, rarely any: more[0] = {how many follow, capacity}, then the holdings.
    std::unique_ptr<Holding[]> more;
  };
  // Where a writer stands in a batch between two slices.
  struct Cursor {
    size_t event = 0;       // next event
    size_t block = 0;       // next block of that event
    RouterHash parent = 0;  // router hash of the block before `block` (stored events)
    bool started = false;   // the event's holder and checks are done (`target` set, or skipped)
    std::optional<HolderId> target;  // the event's holder
    size_t holder = 0;      // AllBlocksCleared: next of the rank's holders to empty
  };
  struct Work {  // what one slice may still do
    size_t blocks = kSliceBlocks;
    size_t tokens = kSliceTokens;
    size_t rehash = kSliceRehash;
    bool fresh() const { return blocks == kSliceBlocks && tokens == kSliceTokens && rehash == kSliceRehash; }
    bool spent() const { return blocks == 0 || tokens == 0; }
  };

  Rank& rank_for(std::string_view node, uint32_t dp_rank);
  Rank* find_rank(std::string_view node, uint32_t dp_rank);  // null when none
  // The holder of (rank, group, tier), created when `create`; nullopt when absent, or when
  // creating it would pass kMaxGroupsPerRank.
  std::optional<HolderId> holder_for(Rank& rank, std::string_view node, uint32_t dp_rank, uint32_t group, Tier tier,
                                     bool create);
  // Whether a stored event's group gives prefix hits (the rules above), remembering kinds seen.
  bool prefix_group(Rank& rank, const proto::KvEvent& event);
  void remember_lora(const std::string& name);
  // The same engine hash in another tier of `h`'s group, or nullptr.
  const Block* twin(const Holder& h, proto::EngineHash engine) const;
  // One event, from cursor->block on, until it is done (true) or the slice's work is spent.
  // `rank`: the batch's (node, DP rank), null until its first store makes it.
  bool stored_event(Rank*& rank, std::string_view node, uint32_t dp_rank, const proto::KvEvent& event,
                    Cursor* cursor, Work* work);
  bool removed_event(Rank* rank, std::string_view node, uint32_t dp_rank, const proto::KvEvent& event,
                     Cursor* cursor, Work* work);
  bool cleared_event(Rank* rank, Cursor* cursor, Work* work);
  bool store(HolderId id, const proto::KvEvent& event, Cursor* cursor, Work* work);
  bool remove(HolderId id, const proto::KvEvent& event, Cursor* cursor, Work* work);
  bool clear(HolderId id, Work* work);
  // Unlinks one entry from holders_of_ and the store order (its map erases it).
  void forget(HolderId id, Block& block);
  void link(HolderId id, RouterHash hash);
  void unlink(HolderId id, RouterHash hash);
  void push_newest(Block* block);
  void unlink_order(Block* block);
  void evict_oldest(Work* work);
  void drop_holders(std::string_view node, std::optional<uint32_t> dp_rank);
  void after_slice() const {
    if (slice_hook_) slice_hook_();
  }

  const size_t max_entries_;
  std::mutex writer_mu_;  // one writer at a time, across all of its slices
  // Shared for lookups and stats, exclusive for a writer's slice; writer-first, so a stream of
  // lookups cannot keep a writer (and so the index's freshness) waiting.
  mutable WriterFirstSharedMutex mu_;
  std::vector<std::unique_ptr<Holder>> holders_;  // by HolderId; null once dropped
  // Dropped slots, reused by the next new holder (once their entries are all gone).
  std::vector<HolderId> free_ids_;
  std::map<std::pair<std::string, uint32_t>, Rank, std::less<>> ranks_;  // by (node, DP rank)
  std::set<std::string, std::less<>> lora_names_;
  ShardedHashMap<Holdings> holders_of_;  // router hash -> holders that hold it
  Block* oldest_ = nullptr;  // the budget's store order
  Block* newest_ = nullptr;
  uint64_t entries_ = 0;
  Stats totals_;
  std::function<void()> slice_hook_;
};

}  // namespace pdr::router::cache
