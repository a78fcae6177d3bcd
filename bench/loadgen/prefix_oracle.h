// The prefix-cache hit rate an oracle would reach on a workload: a router that knows every
// node's cache, over caches that never evict, reuses every block of a prompt whose whole prefix
// up to that block was already sent in an earlier request. Counted in full blocks of
// block_tokens tokens, chained like vLLM's block hashes (a block matches only with everything
// before it), so it is comparable with the engines' own prefix-cache hit counters.
//
// Tokens are what the client knows without a tokenizer: words of a text prompt (one token per
// word on pdnode sim), ids of a token-id prompt. Chat prompts count the words of their messages'
// contents (a chat template's own tokens are unknown here).
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "bench/loadgen/workload.h"

namespace pdr::loadgen {

// The whitespace-separated words of `text` (views into it): pdnode sim's tokens.
std::vector<std::string_view> words_of(std::string_view text);

// A prompt's tokens as 64-bit keys: token ids as they are, words hashed.
std::vector<uint64_t> prompt_token_keys(const BenchRequest& request, PromptFormat format);

class PrefixOracle {
 public:
  explicit PrefixOracle(uint32_t block_tokens) : block_tokens_(block_tokens ? block_tokens : 1) {}

  // A prompt sent now: returns the tokens of it an oracle cache holds (a multiple of
  // block_tokens), then remembers its blocks.
  uint64_t add(const std::vector<uint64_t>& tokens);

  uint64_t prompt_tokens() const { return prompt_tokens_; }
  uint64_t hit_tokens() const { return hit_tokens_; }
  // hit / prompt tokens, 0 before any prompt.
  double hit_rate() const;

 private:
  uint32_t block_tokens_;
  std::unordered_set<uint64_t> blocks_;  // chained hashes of every block seen
  uint64_t prompt_tokens_ = 0, hit_tokens_ = 0;
};

}  // namespace pdr::loadgen
