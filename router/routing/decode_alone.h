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
// configuration says).
enum class DecodeAloneReason : uint8_t { kShortPrompt, kCached, kParallelSampling };
constexpr size_t kDecodeAloneReasonCount = 3;
std::string_view to_string(DecodeAloneReason reason);  // "short_prompt", "cached", "n_above_1"

// `prompt_raw`: the JSON text of the request's "prompt" (or "messages"); `cache`: the request's
// cache lookup (null without one); `decode_key`: the chosen decode. Nullopt: the usual P/D.
// Never for a dialect without a no-KV request (Dialect::without_kv): its decode would wait for
// KV that never comes.
std::optional<DecodeAloneReason> decode_alone_reason(const config::Topology::ConditionalDisaggregation& config,
                                                     const proto::Dialect* dialect, std::string_view prompt_raw,
                                                     const CacheHits* cache, std::string_view decode_key);

// Tokens of a prompt as pdrouter can tell without a tokenizer: a token-id array's length, else
// its JSON text's bytes / 4 (at least 1), the usual rule of thumb for English BPE tokenizers.
uint32_t estimated_prompt_tokens(std::string_view prompt_raw);

}  // namespace pdr::router::routing
