// Body edits and small helpers shared by several dialect files (proto/dialects/*.cc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "proto/json_splice.h"

namespace pdr::proto::dialects {

// "[host]" for an IPv6 literal, else the host as it is.
std::string bracket_host(std::string_view host);

// The prefill edits ("P7" in proto/REQUEST_LEGS.md; docs/design/wire-formats.md 3, 1.3 step 5, 4, rule
// 7): stream false, max_tokens 1, max_completion_tokens 1 if present, no stream_options, no
// min_tokens / min_completion_tokens.
void apply_prefill_edits(JsonObjectBody* body);

// MoRIIO decode: max_completion_tokens -= 1 if it is an integer, else max_tokens -= 1 if it is an
// integer; values <= 1 are left as they are.
void decrement_decode_tokens(JsonObjectBody* body);

// The no-KV fallback of the dialects whose decode waits for the prefill's blocks: the decode is
// sent as a plain request (it recomputes the prompt) without kv_transfer_params.
void drop_kv_transfer_params(JsonObjectBody* decode);

}  // namespace pdr::proto::dialects
