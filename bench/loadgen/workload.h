// The requests pdrouter-bench sends and when: vLLM's "random" dataset and arrival process
// (`vllm bench serve --dataset-name random --request-rate R --burstiness B`). Pure and
// deterministic for a seed: the same options give the same prompts and the same schedule.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "proto/base/status.h"

namespace pdr::loadgen {

enum class PromptFormat {
  kWords,     // text of random common English words, one word per token: a typical BPE tokenizer
              // (and pdnode sim) counts one token per " word"
  kTokenIds,  // a JSON array of random token ids in [kFirstTokenId, vocab_size): the exact input
              // length on any model, completions API only
};

struct WorkloadOptions {
  uint32_t num_prompts = 1000;
  uint32_t input_len = 1024;   // tokens
  uint32_t output_len = 128;   // max_tokens
  double range_ratio = 0.0;    // lengths drawn uniformly from [len*(1-r), len*(1+r)], r in [0, 1)
  uint64_t seed = 0;
  PromptFormat format = PromptFormat::kWords;
  uint32_t vocab_size = 32000;  // kTokenIds only
};

// Token ids below this are special tokens in common vocabularies (BOS/EOS/pad); never sent.
inline constexpr uint32_t kFirstTokenId = 1000;

struct BenchRequest {
  uint32_t index = 0;
  std::string prompt_json;  // a JSON value: a string, or an array of token ids
  std::string prompt_text;  // the words (kWords; chat sends them as the message content)
  uint32_t input_len = 0;   // tokens in the prompt as generated
  uint32_t output_len = 0;  // max_tokens asked for
  // Multi-turn (cache_workloads.h): the request whose prompt and answer this turn extends. Its
  // prompt fields then hold only the new user message; the runner composes the prompt as sent
  // (compose_turn) once that request has answered.
  std::optional<uint32_t> previous_turn;
  // Chat: the messages array as sent (JSON), when it is more than one user message.
  std::string messages_json;
  // Sent as the body's top-level "conversation_id" when not empty (multi_turn with
  // --multi-turn-conversation-id: pdrouter's multi-turn KV reuse keys on it).
  std::string conversation_id;
  // Trace replay (trace_workload.h): the seed of each block of the token-id prompt, every block
  // block_tokens long but the last. prompt_json is then empty: the runner builds the prompt
  // (trace_prompt_ids) when the request is sent.
  std::vector<uint64_t> block_seeds;
  uint32_t block_tokens = 0;
};

// All prompts of a run are generated before it starts: at most this many tokens in total.
inline constexpr uint64_t kMaxTotalPromptTokens = 500'000'000;

// Checks ranges (non-zero lengths and count, ratio in [0, 1), vocab_size > kFirstTokenId, the
// total prompt size) and names the bad option.
Status validate(const WorkloadOptions& options);

// options must be valid. Every prompt is distinct (a random prompt shares no prefix with
// another beyond chance), so a prefix cache does not flatter the numbers.
std::vector<BenchRequest> make_random_requests(const WorkloadOptions& options);

// The generators' building blocks, shared with cache_workloads.cc: `count` random words (with
// single spaces between, none around) appended to *text, or `count` random ids in
// [kFirstTokenId, vocab_size) appended to *ids.
void append_random_words(std::mt19937_64& rng, uint32_t count, std::string* text);
void append_random_ids(std::mt19937_64& rng, uint32_t count, uint32_t vocab_size,
                       std::vector<uint32_t>* ids);
// "[1,2,3]"
std::string token_ids_json(const std::vector<uint32_t>& ids);

// Send times, in seconds from the start, of `count` requests: the first at 0, then gaps drawn
// from a gamma distribution with shape `burstiness` and mean 1/`rate` (vLLM's model:
// burstiness 1 is a Poisson process, higher is more regular, lower is burstier). A rate of 0 or
// infinity sends everything at once.
std::vector<double> arrival_offsets(uint32_t count, double rate, double burstiness, uint64_t seed);

}  // namespace pdr::loadgen
