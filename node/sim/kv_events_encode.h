// The msgpack payload of one vLLM KV events batch, as `pdnode sim` publishes it (the decoder
// router side: proto/kv_events.h; wire facts: docs/design/kv-events.md, Payload). Pure; no I/O.
//
// Batch: [ts, events, dp_rank] (vLLM's EventBatch, array-like). Events, by encoding:
//   kMap (vLLM >= 0.26, msgspec tagged structs): {"type": "BlockStored", "block_hashes": [...],
//     "parent_block_hash": u64|nil, "token_ids": [...], "block_size": N, "lora_id": nil,
//     "medium": "GPU", "lora_name": nil}; {"type": "BlockRemoved", "block_hashes": [...],
//     "medium": "GPU"}; {"type": "AllBlocksCleared"}. Required fields are present even when nil,
//     defaulted optional ones omitted, as msgspec's omit_defaults does.
//   kArray (older vLLM): the same fields positionally, tag first: ["BlockStored", block_hashes,
//     parent_block_hash, token_ids, block_size, lora_id, medium, lora_name];
//     ["BlockRemoved", block_hashes, medium]; ["AllBlocksCleared"].
// Hashes are unsigned 64-bit integers (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, vLLM's default).
//
// A hybrid model's KV cache groups and a CPU offload tier, as newer vLLM publishes them
// (SimKvEventsShape; `pdnode sim --kv-events-groups`, `--kv-events-cpu-tier`):
//   - groups: each change is published once per group, with group_idx (its position) and, on
//     stores, kv_cache_spec_kind and kv_cache_spec_sliding_window (array encoding: the 12
//     positional fields, extra_keys nil). A group with a window slides past the rest of a run at
//     once: after a stored run, a group of W tokens removes the run's blocks before its last
//     ceil(W / block_size) (vLLM frees what a sliding window left behind; here it goes at once, as
//     under memory pressure). Without a window a group keeps every block (a "mamba" group so is
//     vLLM's mamba_cache_mode "all", a state per block). Evictions are removed from every group.
//   - cpu tier: every stored run is offloaded to a CPU tier that keeps it (until a reset): a
//     second BlockStored with medium "CPU" (map encoding: locality "LOCAL") in each group of a
//     full-attention kind (or once, without groups), either self-describing (the run's tokens and
//     parent) or as the offloading connector's placeholder (engine keys only, token_ids [],
//     block_size 0, parent nil). GPU evictions leave the CPU copies.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "node/sim/prefix_cache.h"

namespace pdr::node::sim {

enum class KvEventsEncoding { kMap, kArray };

// "map" / "array"; false for anything else.
bool parse_kv_events_encoding(std::string_view text, KvEventsEncoding* out);

struct SimKvGroup {
  std::string kind;            // vLLM's KVCacheSpecKind value: full_attention, sliding_window, mamba, ...
  uint32_t window_tokens = 0;  // sliding window (0: none)
};
enum class SimCpuTier { kNone, kSelfDescribing, kPlaceholder };

struct SimKvEventsShape {
  KvEventsEncoding encoding = KvEventsEncoding::kMap;
  std::vector<SimKvGroup> groups;  // empty: events name no group (vLLM before hybrid groups)
  SimCpuTier cpu_tier = SimCpuTier::kNone;
};

// "KIND[:WINDOW],...", e.g. "full_attention,sliding_window:512" (KIND: letters, digits and '_';
// WINDOW: 1..2^24 tokens); "" is no groups. At most 16 groups. The message says what is wrong.
bool parse_kv_events_groups(std::string_view text, std::vector<SimKvGroup>* out, std::string* error);
// "none" / "self-describing" / "placeholder"; false for anything else.
bool parse_kv_events_cpu_tier(std::string_view text, SimCpuTier* out);

// One batch of the cache's changes (stored runs become BlockStored, evicted runs BlockRemoved),
// shaped by `shape` (above).
std::string encode_sim_kv_batch(double ts, uint32_t dp_rank, const SimKvEventsShape& shape,
                                uint32_t block_size, std::span<const PrefixCacheChange> changes);
// The same with events of one group-less GPU cache.
std::string encode_sim_kv_batch(double ts, uint32_t dp_rank, KvEventsEncoding encoding,
                                uint32_t block_size, std::span<const PrefixCacheChange> changes);
// One batch holding a single AllBlocksCleared.
std::string encode_sim_kv_cleared_batch(double ts, uint32_t dp_rank, KvEventsEncoding encoding);

}  // namespace pdr::node::sim
