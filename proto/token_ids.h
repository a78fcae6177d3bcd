// Token ids of a request's prompt, when the client sent them: `/v1/completions` accepts an
// integer array as `prompt` (vLLM: one prompt of token ids), which the cache-aware policy can
// match exactly against the nodes' KV events (router/cache/block_index.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace pdr::proto {

// Parses `raw`, the JSON text of one value (already validated JSON), as an array of integers in
// [0, 2^32). True and *out filled when it is one with 1..max_tokens elements; false for anything
// else (a string, an array of strings or arrays (a batch), a negative, fractional or exponent
// number, too many elements), leaving *out unspecified.
bool parse_token_id_array(std::string_view raw, size_t max_tokens, std::vector<uint32_t>* out);

}  // namespace pdr::proto
