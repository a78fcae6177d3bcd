// The token ids `pdnode sim` attributes to a request's prompt, for its prefix cache
// (prefix_cache.h). They follow the sim's token count (generation.h): a token-id prompt
// is its ids as given (the first of a list of lists; each id taken modulo 2^32; /inference/v1/
// generate's token_ids the same); a text prompt
// (the first of a list of strings) is one id per whitespace-separated word; a chat request one id
// per word of every message's text content, in order (an Anthropic request's `system` first). A word of the sim's vocabulary
// (sim_vocabulary_word) has its index there as id; any other word FNV-1a-64 of its bytes folded
// into [1000, 32000), so equal texts give equal ids on every node, and a text prompt that extends
// another extends its ids. POST /tokenize (aux_api.h) answers these same ids, so a router that
// tokenizes text through a node matches the blocks the sim's prefix cache publishes. Pure; no I/O.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim/generation.h"

namespace pdr::node::sim {

inline constexpr uint32_t kFirstWordTokenId = 1000;
inline constexpr uint32_t kWordTokenIdEnd = 32000;

uint32_t word_token_id(std::string_view word);
// Appends the ids of `text`'s words.
void append_word_token_ids(std::string_view text, std::vector<uint32_t>* out);
// `body` is a request parse_generation_request() accepted (anything else gives what it can).
std::vector<uint32_t> prompt_token_ids(ApiKind kind, const nlohmann::json& body);

}  // namespace pdr::node::sim
