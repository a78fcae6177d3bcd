// Workloads that exercise prefix caches, as `vllm bench serve` offers them:
//
// prefix_repetition (vLLM's dataset of that name and flags, --prefix-repetition-*): num_prefixes
//   long "system prompts"; each request is one of them plus a random suffix. num_prompts /
//   num_prefixes requests per prefix (the rest spread over the first prefixes), in a shuffled
//   order, so requests over one prefix arrive interleaved with the others.
// multi_turn (the conversation shape of vLLM's multi-turn benchmark): num_conversations
//   conversations of num_turns turns. Each turn's prompt is the previous turn's prompt, that
//   turn's answer and a new user message: for chat the messages array grows (user, assistant,
//   user, ...), for completions the text grows. A turn is sent only once the previous turn of its
//   conversation has answered; conversations run concurrently. Requests are ordered turn by turn
//   (every conversation's first turn, then every second turn, ...), so the arrival process
//   (--request-rate) spaces the conversations' starts and, for later turns, acts as think time.
//
// Both in words and (completions) token ids; pure and deterministic for a seed.
#pragma once

#include <string_view>
#include <vector>

#include "proto/base/status.h"
#include "bench/loadgen/workload.h"

namespace pdr::loadgen {

struct PrefixRepetitionOptions {
  uint32_t prefix_len = 256;  // tokens of each shared prefix
  uint32_t suffix_len = 256;  // tokens of each request's own random suffix
  uint32_t num_prefixes = 10;
  uint32_t output_len = 128;
};

struct MultiTurnOptions {
  uint32_t num_conversations = 16;
  uint32_t num_turns = 4;
  uint32_t input_len = 256;  // tokens of each new user message (the first turn's whole prompt)
  uint32_t output_len = 64;  // max_tokens of every turn
  bool conversation_ids = false;  // each turn carries conversation_id "conv-<c>"
};

// Ranges and the total prompt size (every prompt as sent, answers counted at output_len); names
// the bad flag. workload: seed, format and vocab_size are used.
Status validate(const WorkloadOptions& workload, const PrefixRepetitionOptions& options);
Status validate(const WorkloadOptions& workload, const MultiTurnOptions& options);

// workload.num_prompts requests; options valid.
std::vector<BenchRequest> make_prefix_repetition_requests(const WorkloadOptions& workload,
                                                          const PrefixRepetitionOptions& options);

// num_conversations * num_turns requests; request k * num_conversations + c is turn k of
// conversation c, with previous_turn set for k > 0 and only the new user message in its prompt.
std::vector<BenchRequest> make_multi_turn_requests(const WorkloadOptions& workload,
                                                   const MultiTurnOptions& options);

// The next turn as sent: `previous` as it was sent, `answer` the text it got back (possibly empty
// when it failed), `turn` the new user message (from make_multi_turn_requests).
//   words, completions: prompt_text = previous text + " " + answer + " " + new message;
//   words, chat: messages_json = previous messages + {assistant: answer} + {user: new message};
//     prompt_text is still the whole conversation's text (for counting and the oracle);
//   token ids: previous ids + a stand-in for the answer + the new ids. The client has no
//     tokenizer, so the answer's words are mapped to ids by a hash, one id per word
//     (deterministic: the same answer gives the same ids; on a real model these are not the
//     answer's true ids, so a cache holding the decode's own blocks of the answer does not match
//     them, while the whole earlier prompt still does).
// input_len = previous input_len + answer words + the new message's input_len.
BenchRequest compose_turn(const BenchRequest& previous, std::string_view answer,
                          const BenchRequest& turn, PromptFormat format, bool chat,
                          uint32_t vocab_size);

}  // namespace pdr::loadgen
