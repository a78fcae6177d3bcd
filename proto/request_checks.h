// The client parameters pdrouter refuses itself, before it pairs nodes or sends any leg, on the
// P/D text endpoints (/v1/completions, /v1/chat/completions, /v1/responses): every refusal is a
// 400 naming the field. A value a node would refuse only after the prefill leg (rewritten to one
// token) ran the whole prompt is cheaper to refuse here. What is left to the nodes is what
// depends on the model (a token cap above its context length is vLLM's to clamp or refuse).
//
//   max_tokens, max_completion_tokens, and on /v1/responses max_output_tokens:
//       an integer from 1 to kMaxTokenCount, or null. 0 and negatives are vLLM's own 400
//       ("must be at least 1"); a float ("1e10", "12.5") is no token count; a value beyond
//       kMaxTokenCount can never be generated (no model has a context of 2^31 tokens) and does
//       not fit the 32-bit counts engines keep.
//   n   an integer >= 1 or null; *choices gets it (1 when absent or null).
//   stream  true, false or null (a string such as "yes" is refused, not guessed at).
// /inference/v1/generate has its own checks (generate_request.h), with the same bounds.
//
// Pure; no I/O.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "proto/json_splice.h"

namespace pdr::proto {

inline constexpr int64_t kMaxTokenCount = 2147483647;  // 2^31 - 1

// A message for the 400, or nothing. `path` is the request's path.
std::optional<std::string> check_client_parameters(std::string_view path, const JsonObjectBody& body,
                                                   int64_t* choices);

// `key` of `body` (named `prefix` + key in messages) is absent, null, or an integer in
// [least, kMaxTokenCount]; else a message.
std::optional<std::string> check_token_count(const JsonObjectBody& body, std::string_view key,
                                             std::string_view prefix, int64_t least);

}  // namespace pdr::proto
