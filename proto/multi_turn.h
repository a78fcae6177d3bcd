// Multi-turn KV reuse with NIXL's bidirectional_kv_xfer (docs/design/wire-formats.md section 9, vLLM's
// disagg_proxy_multiturn.py): the decode of one turn ends its answer with kv_transfer_params
// naming the blocks it keeps for the conversation (the last SSE chunk, or the JSON answer); the
// next turn's prefill gets them with do_remote_decode true, do_remote_prefill false and
// remote_host the decode's host, and pulls those blocks instead of recomputing the prefix.
// Pure functions over bytes.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "proto/base/status.h"
#include "proto/json_splice.h"

namespace pdr::proto {

// The kv_transfer_params object of one JSON object (a decode's JSON answer or one stream chunk's
// data): its raw text (a view into `json_object`), or nullopt when the text is not a JSON object
// or the member is absent, null, not an object, or {}.
std::optional<std::string_view> kv_transfer_params_of(std::string_view json_object, const JsonLimits& limits);

// The next turn's prefill kv_transfer_params from the decode's: every member kept (newer vLLM
// adds some), do_remote_decode true, do_remote_prefill false; remote_host as the decode named
// it (its side channel), or `decode_host` when it named none (absent or null).
// kMissingKey when remote_block_ids or remote_engine_id is absent or null (nothing to pull);
// kWrongType when remote_host is not a string; kMalformed and friends when `decode_params` is not
// a JSON object.
Status next_turn_prefill_params(std::string_view decode_params, std::string_view decode_host,
                                const JsonLimits& limits, std::string* out);

// Whether a next turn's prefill (registered host `prefill_host`) may be given `prefill_params`
// (next_turn_prefill_params' output, kept locally or mirrored from another replica): the prefill
// connects to their remote_host to pull the decode's blocks, and that host is the decode's word,
// so it must pass side_channel_host_ok against the decode's registered host `decode_host` (the
// rule a prefill's answer meets on the pairing path). kRejected naming both hosts; kWrongType
// when remote_host is absent, null or not a string; kMalformed and friends when the params are
// not a JSON object.
Status check_next_turn_remote_host(std::string_view prefill_params, std::string_view decode_host,
                                   std::string_view prefill_host, const JsonLimits& limits);

}  // namespace pdr::proto
