// The msgpack payload of one vLLM KV events batch, as `pdnode sim` publishes it (the decoder
// router side: proto/kv_events.h; wire facts: shared/API_FACTS.md 2.2). Pure; no I/O.
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
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "node/sim_prefix_cache.h"

namespace pdr::node::sim {

enum class KvEventsEncoding { kMap, kArray };

// "map" / "array"; false for anything else.
bool parse_kv_events_encoding(std::string_view text, KvEventsEncoding* out);

// One batch of the cache's changes (stored runs become BlockStored, evicted runs BlockRemoved).
std::string encode_sim_kv_batch(double ts, uint32_t dp_rank, KvEventsEncoding encoding,
                                uint32_t block_size, std::span<const PrefixCacheChange> changes);
// One batch holding a single AllBlocksCleared.
std::string encode_sim_kv_cleared_batch(double ts, uint32_t dp_rank, KvEventsEncoding encoding);

}  // namespace pdr::node::sim
