// GET /debug/cache?tokens=1,2,3[&lora=NAME]: which nodes hold the longest prefix of a token list,
// for operators checking the KV events index (router/cache/). Behind the admin key.
//
//   200 {"tokens": n, "lora": NAME|null, "lora_known": bool, "index_entries": n,
//        "nodes": [{"node": "host:port", "matched_blocks": b, "gpu_blocks": g, "block_size": s,
//                   "matched_tokens": b*s, "cached_tokens": t}, ...]}
//       most cached_tokens first (BlockIndex::longest_prefix: b leading blocks held on the GPU or
//       a CPU tier, g of them on the GPU; t = what cache-aware routing counts, PrefixMatch::
//       cached_tokens()); lora_known: whether the events named NAME as an adapter
//       (BlockIndex::knows_lora; cache-aware routing then matches only its blocks)
//   400 invalid_request_error, code "bad_tokens": tokens missing or empty, an entry not a
//       decimal integer 0..4294967295, more than kMaxDebugCacheTokens entries, a bad
//       percent-encoding, an unknown or repeated parameter; lora over 256 bytes
//   404 code "kv_events_disabled": kv_events.enabled is false
// Pure: parses the query and renders; no I/O.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"
#include "router/http/http_message.h"
#include "router/cache/block_index.h"

namespace pdr::router {

inline constexpr size_t kMaxDebugCacheTokens = size_t{1} << 20;

struct DebugCacheQuery {
  std::vector<uint32_t> tokens;
  std::optional<std::string> lora;
};

// Parses the query string (after '?'). The error names the parameter at fault.
Status parse_debug_cache_query(std::string_view query, DebugCacheQuery* out);

// The answer for a query; `index` null = KV events disabled.
http::Response debug_cache_response(std::string_view query, const cache::BlockIndex* index);

}  // namespace pdr::router
