// Conditional disaggregation (topology conditional_disaggregation:): whether one request skips
// its prefill leg and goes to the decode alone, which then computes the prompt itself. Worth it
// when the prefill hop costs more than it saves: a short prompt, or a decode that already holds
// nearly all of the prompt in its prefix cache. Pure.
#pragma once

#include <optional>
#include <string_view>

#include "discovery/config/topology.h"
#include "proto/dialects/dialect.h"
#include "router/policies/policy.h"

namespace pdr::router::routing {

// kParallelSampling: n > 1, which P/D cannot serve (the session decides it, whatever the
// configuration says). kPrefillBusy: decode_alone_sooner below.
enum class DecodeAloneReason : uint8_t { kShortPrompt, kCached, kParallelSampling, kPrefillBusy };
constexpr size_t kDecodeAloneReasonCount = 4;
// "short_prompt", "cached", "n_above_1", "prefill_busy"
std::string_view to_string(DecodeAloneReason reason);

// `prompt_raw`: the JSON text of the request's "prompt" (or "messages"); `cache`: the request's
// cache lookup (null without one); `decode_key`: the chosen decode. Nullopt: the usual P/D.
// Never for a dialect without a no-KV request (Dialect::without_kv): its decode would wait for
// KV that never comes.
std::optional<DecodeAloneReason> decode_alone_reason(const config::Topology::ConditionalDisaggregation& config,
                                                     const proto::Dialect* dialect, std::string_view prompt_raw,
                                                     const CacheHits* cache, std::string_view decode_key);

// The prefills are busy (prefill_busy_ms): the chosen decode's predicted TTFT computing the
// prompt itself, when it should, from a predicting policy's explanation of both legs
// (predicted_latency); nullopt when it should not. It should when the prompts queued on the
// chosen prefill ahead of this one take at least prefill_busy_ms at the rate it was predicted at,
// the decode, computing the `decode_uncached_tokens` it lacks at that rate, answers sooner than
// the prefill's predicted TTFT, and the requests decoding there are not slowed past what they
// may be. A prompt computed on a decode shares every engine step with its decodes, one chunk of
// up to the node's token budget a step (model.step_token_budget, vLLM's
// --max-num-batched-tokens), and at 8,192 tokens such a step takes about 180 ms on an 8B model
// against 8 ms for a decode step. So:
//   - with a TPOT SLO (model.slo_tpot_ms, the topology's default: the operator's promise to every
//     stream, which one request's header cannot loosen), the decode's predicted time per output
//     token with one chunk of prompt in each step must stay within it. The prompts it already
//     computes come first (they count in its answer). Decodes run with a small token budget
//     (e.g. 512) then take prompts while they stream;
//   - without one (or past it), the decode must be idle (no stream, no prompt), and another
//     decode candidate must have no prompt to compute, for the P/D decodes that come next (the
//     predicted_latency decode leg steers them away from a node computing one: predict_tpot).
// Either way spare decode capacity becomes prefill capacity exactly when the prefills are the
// bottleneck.
std::optional<double> decode_alone_when_busy(const config::Topology::ConditionalDisaggregation& config,
                                             const config::Topology::Policies::PredictedLatency& model,
                                             const proto::Dialect* dialect, const RouteExplanation& explanation,
                                             uint64_t decode_uncached_tokens);

// Tokens of a prompt as pdrouter can tell without a tokenizer: a token-id array's length, else
// its JSON text's bytes / 4 (at least 1), the usual rule of thumb for English BPE tokenizers.
uint32_t estimated_prompt_tokens(std::string_view prompt_raw);

}  // namespace pdr::router::routing
