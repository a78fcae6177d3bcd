// Multi-turn KV reuse with NIXL's bidirectional_kv_xfer (API_FACTS.md section 4, vLLM's
// disagg_proxy_multiturn.py): the decode of one turn ends its answer with kv_transfer_params
// naming the blocks it keeps for the conversation (the last SSE chunk, or the JSON answer); the
// next turn's prefill gets them with do_remote_decode true, do_remote_prefill false and
// remote_host the decode's host, and pulls those blocks instead of recomputing the prefix.
// Pure functions over bytes.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "proto/json_splice.h"

namespace pdr::proto {

// The kv_transfer_params object of one JSON object (a decode's JSON answer or one stream chunk's
// data): its raw text (a view into `json_object`), or nullopt when the text is not a JSON object
// or the member is absent, null, not an object, or {}.
std::optional<std::string_view> kv_transfer_params_of(std::string_view json_object, const JsonLimits& limits);

// The next turn's prefill kv_transfer_params from the decode's: every member kept (newer vLLM
// adds some), do_remote_decode true, do_remote_prefill false, remote_host `decode_host`.
// kMissingKey when remote_block_ids or remote_engine_id is absent or null (nothing to pull);
// kMalformed and friends when `decode_params` is not a JSON object.
Status next_turn_prefill_params(std::string_view decode_params, std::string_view decode_host,
                                const JsonLimits& limits, std::string* out);

}  // namespace pdr::proto
