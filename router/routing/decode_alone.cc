#include "router/routing/decode_alone.h"

#include <algorithm>
#include <vector>

#include "proto/token_ids.h"

namespace pdr::router::routing {

std::string_view to_string(DecodeAloneReason reason) {
  switch (reason) {
    case DecodeAloneReason::kShortPrompt:
      return "short_prompt";
    case DecodeAloneReason::kCached:
      return "cached";
    case DecodeAloneReason::kParallelSampling:
      return "n_above_1";
  }
  return "unknown";
}

uint32_t estimated_prompt_tokens(std::string_view prompt_raw) {
  thread_local std::vector<uint32_t> tokens;
  if (proto::parse_token_id_array(prompt_raw, 1u << 24, &tokens)) return static_cast<uint32_t>(tokens.size());
  return static_cast<uint32_t>(std::max<size_t>(1, prompt_raw.size() / 4));
}

std::optional<DecodeAloneReason> decode_alone_reason(const config::Topology::ConditionalDisaggregation& config,
                                                     const proto::Dialect* dialect, std::string_view prompt_raw,
                                                     const CacheHits* cache, std::string_view decode_key) {
  if (!config.enabled || dialect == nullptr || dialect->without_kv == nullptr || prompt_raw.empty()) {
    return std::nullopt;
  }
  if (config.max_prompt_tokens != 0) {
    // A KV-events lookup already counted the prompt's token ids: no second parse of them.
    const uint32_t tokens = cache != nullptr && cache->source == CacheHits::Source::kKvEvents
                                ? cache->prompt_units
                                : estimated_prompt_tokens(prompt_raw);
    if (tokens <= config.max_prompt_tokens) return DecodeAloneReason::kShortPrompt;
  }
  if (config.min_cached_percent != 0 && cache != nullptr && cache->prompt_units != 0) {
    const uint64_t matched = cache->matched(decode_key);
    if (matched * 100 >= uint64_t{config.min_cached_percent} * cache->prompt_units) return DecodeAloneReason::kCached;
  }
  return std::nullopt;
}

}  // namespace pdr::router::routing
