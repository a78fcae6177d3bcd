// How many tokens a request's prompt has, and how many of them a node must still compute, as
// far as pdrouter knows without a tokenizer of its own. Feeds the load ledger's queued prefill
// tokens and KV tokens (discovery/load_ledger.h), and a policy that predicts prefill time.
//
// Sources, best first: the prompt's own token ids (an integer array: `/v1/completions` with
// token ids, `/inference/v1/generate`'s token_ids), counted exactly; a node's /tokenize answer
// (policies.cache_aware.tokenize: node); else an estimate of a quarter of the prompt's JSON text
// bytes (about four bytes a token for English text with common BPE vocabularies).
// Pure; no allocation.
#pragma once

#include <cstdint>
#include <string_view>

#include "router/policies/policy.h"

namespace pdr::router {

struct PromptTokens {
  enum class Source : uint8_t { kTokenIds, kTokenized, kEstimate };
  uint64_t count = 0;   // at least 1 for a non-empty prompt
  uint64_t bytes = 0;   // of the prompt's raw JSON text
  Source source = Source::kEstimate;
};

// The raw JSON value of the prompt ("prompt", "messages" or "token_ids"; empty: none).
PromptTokens count_prompt_tokens(std::string_view raw_prompt);

// Tokens of the prompt `node_key` must compute: all of them less what `hits` says the node holds
// (tokens from KV events; bytes of prompt text from the prefix tree, scaled to tokens by the
// prompt's bytes per token). `hits` null: none held.
uint64_t uncached_tokens(const PromptTokens& prompt, const CacheHits* hits, std::string_view node_key);

}  // namespace pdr::router
