// The predicted_latency policy: each candidate's latency for this request is predicted from what
// pdrouter has put on it (its load ledger, discovery/load_ledger.h, copied into
// Candidate::load by the pairing) and the least wins. Cache affinity needs no threshold here: a
// node's cache hit shortens its predicted prefill, so the node holding the prompt wins exactly
// when its queue costs less than the tokens it saves.
//
// The cost model (pure functions below, unit-tested):
//   - prefill leg, predicted time to first token:
//       (queued uncached prefill tokens + this prompt's tokens less the node's cache hit)
//         / the node's prefill rate + the KV transfer of the prompt (kv_transfer_us_per_token).
//   - decode leg, predicted time per output token with this request added (vLLM runs every
//     running sequence in one step, whose time grows with the sequences and the KV they read):
//       step + decode_step_us_per_sequence * (sequences + 1)
//            + decode_step_ns_per_kv_token * (KV tokens + this prompt's tokens),
//     plus kv_full_penalty_ms when that KV would exceed kv_capacity_tokens (the engine would
//     preempt a sequence and recompute it), plus, while the node computes a prompt itself (a
//     request it serves alone: queued prefill tokens on a decode), the time of one chunk of it,
//     min(those tokens, step_token_budget) at the prefill rate the request's prefill leg was
//     predicted at (RouteExplanation::prefill_tokens_per_second; else the node's resolved rate):
//     vLLM puts that chunk in every step until the prompt is done. With the load scrape on
//     (topology load_signals) and the node's figures fresh, the sequences include the requests
//     other clients run there (CandidateLoad::other_requests) and the KV held is at least the
//     node's reported usage times kv_capacity_tokens. The prefill prediction does not use them: the page has no token counts.
//   - the prefill choice is not the least TTFT alone: it minimises
//       predicted TTFT + fleet_work_weight * (this prompt's uncached tokens / the node's rate),
//     the second term being the delay that the work a cache miss adds to a node causes the
//     requests queued after it there. With the weight 0 a cold node's shorter queue wins even
//     when recomputing the prompt there costs the fleet more than the hot node's queue costs this
//     request; under load every such choice adds work and lowers the hit rate of the requests
//     after it (bench/serving/GOODPUT_RESULTS.md measured the collapse). The SLO check and the
//     explanation still use the predicted TTFT itself.
//   Figures are per DP rank: those of the rank the node's next leg will be pinned to (pdrouter
//   turns its legs over the ranks in order, next_dp_rank in router/routing/pairing.h), as its
//   ledger counts them: one long prompt queued on a rank delays what goes there next, not a
//   dp_size-th of it. Without per-rank figures (no leg charged there yet), the node's totals
//   divided by its dp_size. kv_capacity_tokens is per rank (engine).
//   Rates: every prefill is predicted at the candidates' mean measured prefill rate (the
//   fleet's), not its own, unless prefill_rate: node. Each node's estimate (load_ledger.h) is
//   uncached tokens over busy time, so it also carries the node's request mix: tokens computed
//   after a long cached prefix cost more attention than tokens of a fresh prompt. Identical
//   nodes predicted at different rates steer work to the one that looks faster, which then reads
//   slower in turn; on the goodput benchmark per-node rates split the prefill work up to 55/45
//   and lost a speed-up step against the fleet's rate. A decode node's step time stays its own.
//   Cold start: a node without a measured estimate (prefill tokens/s, decode step) takes the mean
//   of the candidates that have one, and with none measured the topology's defaults
//   (policies.predicted_latency.default_prefill_tokens_per_second, default_decode_step_us).
//
// Ties (an idle fleet, equal figures) go, on the decode leg, to the decode holding the most of
// the prompt (a NIXL decode pulls only the blocks it lacks), then to the less loaded by
// outstanding / weight, then rotate, as least_outstanding does. Thread-safety as policy.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "router/policies/policy.h"

namespace pdr::router {

struct PredictedLatencyModel {
  double default_prefill_tokens_per_second = 8000;
  double default_decode_step_seconds = 0.0075;
  double decode_step_seconds_per_sequence = 18e-6;
  double decode_step_seconds_per_kv_token = 45e-9;
  double kv_transfer_seconds_per_token = 5e-6;
  double kv_capacity_tokens = 464000;
  double kv_full_penalty_seconds = 1.0;
  double fleet_work_weight = 8;
  double step_token_budget = 8192;
  bool prefill_rate_per_node = false;  // else the candidates' mean measured rate (resolve_rates)

  static PredictedLatencyModel from(const config::Topology::Policies::PredictedLatency& config);
};

// The rates a candidate is predicted with: its own estimates, else the fleet's, else defaults;
// the prefill rate is the fleet's whenever there is one unless the model's prefill_rate_per_node.
struct ResolvedRates {
  double prefill_tokens_per_second = 0;
  double decode_step_seconds = 0;
};
// `candidates`' mean estimate of each rate over those that have one (0: none has).
ResolvedRates fleet_rates(std::span<const Candidate> candidates);
ResolvedRates resolve_rates(const CandidateLoad& load, const ResolvedRates& fleet, const PredictedLatencyModel& m);

// Per DP rank figures of `c`: its next rank's as given (CandidateLoad::of_next_rank), else its
// totals divided by its weight, rounded up; the scraped other_requests divided either way.
CandidateLoad per_rank(const Candidate& c);

// Seconds one engine step spends on prompts while `prompt_tokens` of them wait to be computed on
// a node: vLLM gives them one chunk of at most its token budget a step, however many prompts
// that is, computed at `tokens_per_second`.
double prompt_chunk_seconds(double prompt_tokens, double step_token_budget, double tokens_per_second);

// Predicted seconds to the first token when `c` runs a prompt of `prompt_tokens` of which it
// holds `cached_tokens`.
double predict_ttft(const CandidateLoad& rank_load, const ResolvedRates& rates, uint64_t prompt_tokens,
                    uint64_t cached_tokens, const PredictedLatencyModel& m);
// What the prefill choice minimises (see above): `ttft` plus fleet_work_weight times the
// seconds of prefill work `uncached_tokens` are at `rates`.
double prefill_score(double ttft, const ResolvedRates& rates, uint64_t uncached_tokens, const PredictedLatencyModel& m);
// Predicted seconds per output token when `c` takes one more sequence of `prompt_tokens` of KV.
// *kv_full (when set) says whether the KV capacity would be exceeded.
double predict_tpot(const CandidateLoad& rank_load, const ResolvedRates& rates, uint64_t prompt_tokens,
                    const PredictedLatencyModel& m, bool* kv_full = nullptr);

std::unique_ptr<Policy> make_predicted_latency_policy(const config::Topology::Policies::PredictedLatency& config,
                                                      PolicyLeg leg);

}  // namespace pdr::router
