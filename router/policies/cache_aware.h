// Cache affinity that yields to load: the rule a cache-aware policy applies once it
// knows how much of the request's prompt each candidate already holds in its KV cache
// (router/cache/block_index.h for token-id prompts). Pure, like the other policies.
//
// The rule, after vllm-router's and SGLang's gateway's cache-aware policies:
//   1. Load first: when the best-matching candidate carries more than `balance_abs_threshold`
//      requests beyond the least loaded one AND more than `balance_rel_threshold` times its load
//      (per unit of weight), affinity is dropped: a hot prefix must not pile every request onto
//      one node while others idle.
//   2. Otherwise the candidate holding the most of the prompt wins, if it holds at least
//      `min_match_ratio` of it (ties: the less loaded one, then the first).
//   3. Else there is nothing worth keeping: the caller picks by load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "router/policies/policy.h"

namespace pdr::router {

struct CacheAwareRule {
  double min_match_ratio = 0.5;
  uint32_t balance_abs_threshold = 32;
  double balance_rel_threshold = 1.5;
};

// `cached_tokens[i]`: leading prompt tokens candidate i holds (same size as `candidates`).
// Returns the candidate to use for its cache, or nullopt when load should decide (rules 1, 3).
std::optional<size_t> pick_by_cache(std::span<const Candidate> candidates, std::span<const uint32_t> cached_tokens,
                                    uint32_t prompt_tokens, const CacheAwareRule& rule);

}  // namespace pdr::router
