#include "router/routing/decode_alone.h"

#include <algorithm>
#include <vector>

#include "proto/token_ids.h"
#include "router/policies/predicted_latency.h"

namespace pdr::router::routing {

namespace {
// The per-DP-rank figures of an explained candidate, as the policy predicted it.
CandidateLoad rank_load(const LegExplanation::Row& row) {
  return per_rank(Candidate{row.key, row.outstanding, row.weight, row.load});
}
}  // namespace

std::string_view to_string(DecodeAloneReason reason) {
  switch (reason) {
    case DecodeAloneReason::kShortPrompt:
      return "short_prompt";
    case DecodeAloneReason::kCached:
      return "cached";
    case DecodeAloneReason::kParallelSampling:
      return "n_above_1";
    case DecodeAloneReason::kPrefillBusy:
      return "prefill_busy";
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

std::optional<double> decode_alone_when_busy(const config::Topology::ConditionalDisaggregation& config,
                                             const config::Topology::Policies::PredictedLatency& model,
                                             const proto::Dialect* dialect, const RouteExplanation& e,
                                             uint64_t decode_uncached_tokens) {
  if (!config.enabled || config.prefill_busy_ms == 0 || dialect == nullptr || dialect->without_kv == nullptr) {
    return std::nullopt;
  }
  const LegExplanation& p = e.prefill;
  const LegExplanation& d = e.decode;
  if (!p.filled || !d.filled || p.chosen >= p.rows.size() || d.chosen >= d.rows.size() ||
      e.prefill_tokens_per_second <= 0) {
    return std::nullopt;
  }
  // Busy: the prompts queued on the prefill ahead of this one (per DP rank, as predicted) take
  // prefill_busy_ms or more. A long prompt on an idle prefill is not a reason to move it.
  const LegExplanation::Row& prefill = p.rows[p.chosen];
  const double queued = static_cast<double>(rank_load(prefill).queued_prefill_tokens);
  if (queued / e.prefill_tokens_per_second * 1000 < config.prefill_busy_ms) return std::nullopt;
  const LegExplanation::Row& decode = d.rows[d.chosen];
  const double rate = e.prefill_tokens_per_second;
  const double uncached = static_cast<double>(decode_uncached_tokens);
  if (model.slo_tpot_ms != 0) {
    // With a TPOT SLO: the prompts the decode computes already come first, and the streams there
    // (and the P/D decodes that come next) share each step with one chunk of prompt, at most the
    // token budget however many prompts wait; that step must stay within the SLO. The decode's
    // prediction already carries a chunk of the prompts it computes (predict_tpot): this prompt
    // adds only what fills that chunk up.
    const double ahead = static_cast<double>(rank_load(decode).queued_prefill_tokens);
    const double budget = model.step_token_budget;
    const double answer = (ahead + uncached) / rate;
    const double added_chunk =
        prompt_chunk_seconds(ahead + uncached, budget, rate) - prompt_chunk_seconds(ahead, budget, rate);
    if (answer < prefill.predicted_seconds && (decode.predicted_seconds + added_chunk) * 1000 <= model.slo_tpot_ms) {
      return answer;
    }
  }
  // Otherwise only an idle decode, and only while another decode computes no prompt (for the
  // P/D decodes that come next).
  const CandidateLoad& mine = decode.load;
  if (mine.decode_sequences != 0 || mine.other_requests != 0 || mine.queued_prefill_tokens != 0) return std::nullopt;
  const double alone = uncached / rate;
  if (alone >= prefill.predicted_seconds) return std::nullopt;
  for (size_t i = 0; i < d.rows.size(); ++i) {
    if (i != d.chosen && d.rows[i].load.queued_prefill_tokens == 0) return alone;
  }
  return std::nullopt;
}

}  // namespace pdr::router::routing
