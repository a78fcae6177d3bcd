#include "router/policies/predicted_latency.h"

#include <algorithm>
#include <atomic>
#include <cassert>

#include "router/policies/prompt_tokens.h"

namespace pdr::router {

PredictedLatencyModel PredictedLatencyModel::from(const config::Topology::Policies::PredictedLatency& c) {
  PredictedLatencyModel m;
  m.default_prefill_tokens_per_second = c.default_prefill_tokens_per_second;
  m.default_decode_step_seconds = c.default_decode_step_us * 1e-6;
  m.decode_step_seconds_per_sequence = c.decode_step_us_per_sequence * 1e-6;
  m.decode_step_seconds_per_kv_token = c.decode_step_ns_per_kv_token * 1e-9;
  m.kv_transfer_seconds_per_token = c.kv_transfer_ns_per_token * 1e-9;
  m.kv_capacity_tokens = c.kv_capacity_tokens;
  m.kv_full_penalty_seconds = c.kv_full_penalty_ms * 1e-3;
  m.fleet_work_weight = c.fleet_work_weight;
  m.prefill_rate_per_node = c.prefill_rate_per_node;
  m.step_token_budget = c.step_token_budget;
  return m;
}

ResolvedRates fleet_rates(std::span<const Candidate> candidates) {
  double prefill_sum = 0, step_sum = 0;
  size_t prefill_n = 0, step_n = 0;
  for (const Candidate& c : candidates) {
    if (c.load.prefill_tokens_per_second > 0) prefill_sum += c.load.prefill_tokens_per_second, ++prefill_n;
    if (c.load.decode_step_seconds > 0) step_sum += c.load.decode_step_seconds, ++step_n;
  }
  return {prefill_n == 0 ? 0 : prefill_sum / static_cast<double>(prefill_n),
          step_n == 0 ? 0 : step_sum / static_cast<double>(step_n)};
}

ResolvedRates resolve_rates(const CandidateLoad& load, const ResolvedRates& fleet, const PredictedLatencyModel& m) {
  ResolvedRates r;
  // One rate for identical nodes unless told otherwise (topology.h, prefill_rate): a node's own
  // estimate carries its request mix, and a node that looks slower for its mix loses work to
  // the others and then reads slower still.
  const double own = m.prefill_rate_per_node ? load.prefill_tokens_per_second : 0;
  r.prefill_tokens_per_second = own > 0                               ? own
                                : fleet.prefill_tokens_per_second > 0 ? fleet.prefill_tokens_per_second
                                : load.prefill_tokens_per_second > 0  ? load.prefill_tokens_per_second
                                                                      : m.default_prefill_tokens_per_second;
  r.decode_step_seconds = load.decode_step_seconds > 0   ? load.decode_step_seconds
                          : fleet.decode_step_seconds > 0 ? fleet.decode_step_seconds
                                                          : m.default_decode_step_seconds;
  return r;
}

CandidateLoad per_rank(const Candidate& c) {
  const uint64_t w = c.weight == 0 ? 1 : c.weight;
  CandidateLoad r = c.load;
  r.other_requests = static_cast<uint32_t>((uint64_t{c.load.other_requests} + w - 1) / w);
  if (c.load.of_next_rank) return r;  // the rank's own figures already
  r.queued_prefill_tokens = (c.load.queued_prefill_tokens + w - 1) / w;
  r.decode_sequences = static_cast<uint32_t>((uint64_t{c.load.decode_sequences} + w - 1) / w);
  r.kv_tokens = (c.load.kv_tokens + w - 1) / w;
  return r;
}

double predict_ttft(const CandidateLoad& rank_load, const ResolvedRates& rates, uint64_t prompt_tokens,
                    uint64_t cached_tokens, const PredictedLatencyModel& m) {
  const uint64_t uncached = prompt_tokens - std::min(cached_tokens, prompt_tokens);
  const double rate = rates.prefill_tokens_per_second > 0 ? rates.prefill_tokens_per_second : 1;
  // The decode pulls (or is pushed) the whole prompt's KV, cached on the prefill or not.
  return static_cast<double>(rank_load.queued_prefill_tokens + uncached) / rate +
         static_cast<double>(prompt_tokens) * m.kv_transfer_seconds_per_token;
}

double prefill_score(double ttft, const ResolvedRates& rates, uint64_t uncached_tokens,
                     const PredictedLatencyModel& m) {
  const double rate = rates.prefill_tokens_per_second > 0 ? rates.prefill_tokens_per_second : 1;
  return ttft + m.fleet_work_weight * static_cast<double>(uncached_tokens) / rate;
}

double prompt_chunk_seconds(double prompt_tokens, double step_token_budget, double tokens_per_second) {
  return std::min(prompt_tokens, step_token_budget) / tokens_per_second;
}

double predict_tpot(const CandidateLoad& rank_load, const ResolvedRates& rates, uint64_t prompt_tokens,
                    const PredictedLatencyModel& m, bool* kv_full) {
  // Sequences other clients run there step with ours; the engine's KV usage (when read) counts
  // their KV too, so the larger of it and the ledger's estimate is held.
  double kv_held = static_cast<double>(rank_load.kv_tokens);
  if (rank_load.kv_cache_usage >= 0) kv_held = std::max(kv_held, rank_load.kv_cache_usage * m.kv_capacity_tokens);
  const double kv_after = kv_held + static_cast<double>(prompt_tokens);
  const uint64_t sequences = uint64_t{rank_load.decode_sequences} + rank_load.other_requests + 1;
  double step = rates.decode_step_seconds + m.decode_step_seconds_per_sequence * static_cast<double>(sequences) +
                m.decode_step_seconds_per_kv_token * kv_after;
  if (rank_load.queued_prefill_tokens > 0 && rates.prefill_tokens_per_second > 0) {
    // A prompt the node computes itself (a decode serving alone) shares its steps: each takes a
    // chunk of up to the step's token budget until the prompt is done.
    step += prompt_chunk_seconds(static_cast<double>(rank_load.queued_prefill_tokens), m.step_token_budget,
                                 rates.prefill_tokens_per_second);
  }
  const bool full = kv_after > m.kv_capacity_tokens;
  if (full) step += m.kv_full_penalty_seconds;
  if (kv_full != nullptr) *kv_full = full;
  return step;
}

namespace {

// Predictions closer than this are a tie (floating-point noise between equal figures).
constexpr double kTieSeconds = 1e-9;

// Per-thread scratch of pick(): cleared and refilled, so a pick allocates nothing once grown.
struct Scratch {
  std::vector<double> predicted;
  std::vector<double> score;  // what is minimised: the prediction, or prefill_score
  std::vector<uint64_t> uncached;
  std::vector<uint8_t> kv_full;
};

class PredictedLatencyPolicy final : public Policy {
 public:
  PredictedLatencyPolicy(const config::Topology::Policies::PredictedLatency& config, PolicyLeg leg)
      : model_(PredictedLatencyModel::from(config)), leg_(leg) {}

  size_t pick(std::span<const Candidate> candidates, const RequestSummary& request) override {
    assert(!candidates.empty());
    thread_local Scratch s;
    s.predicted.clear();
    s.score.clear();
    s.uncached.clear();
    s.kv_full.clear();
    const uint64_t prompt = request.prompt != nullptr ? request.prompt->count : 0;
    const ResolvedRates fleet = fleet_rates(candidates);
    for (const Candidate& c : candidates) {
      const CandidateLoad rank = per_rank(c);
      ResolvedRates rates = resolve_rates(c.load, fleet, model_);
      if (leg_ == PolicyLeg::kDecode && request.explain != nullptr && request.explain->prefill_tokens_per_second > 0) {
        rates.prefill_tokens_per_second = request.explain->prefill_tokens_per_second;
      }
      if (leg_ == PolicyLeg::kPrefill) {
        const uint64_t u = request.prompt != nullptr ? uncached_tokens(*request.prompt, request.cache, c.key) : 0;
        s.uncached.push_back(u);
        const double ttft = predict_ttft(rank, rates, prompt, prompt - std::min(u, prompt), model_);
        s.predicted.push_back(ttft);
        s.score.push_back(prefill_score(ttft, rates, std::min(u, prompt), model_));
        s.kv_full.push_back(0);
      } else {
        bool full = false;
        s.predicted.push_back(predict_tpot(rank, rates, prompt, model_, &full));
        s.score.push_back(s.predicted.back());
        // What of the prompt this decode lacks: a NIXL decode pulls only those blocks, and one
        // computing the prompt alone computes only those. Equal predictions go to the fewest.
        s.uncached.push_back(request.prompt != nullptr ? uncached_tokens(*request.prompt, request.cache, c.key) : 0);
        s.kv_full.push_back(full ? 1 : 0);
      }
    }
    // a strictly beats b: a lower score, or an equal one with (decode) less of the prompt to
    // pull or with less load.
    auto better = [&](size_t a, size_t b) {
      if (s.score[a] < s.score[b] - kTieSeconds) return true;
      if (s.score[b] < s.score[a] - kTieSeconds) return false;
      if (leg_ == PolicyLeg::kDecode && s.uncached[a] != s.uncached[b]) return s.uncached[a] < s.uncached[b];
      return less_loaded(candidates[a], candidates[b]);
    };
    size_t best = 0, ties = 1;
    for (size_t i = 1; i < candidates.size(); ++i) {
      if (better(i, best)) {
        best = i;
        ties = 1;
      } else if (!better(best, i)) {
        ++ties;
      }
    }
    if (ties > 1) {
      // An idle fleet ties on every figure: rotate, or every burst lands on one node.
      size_t nth = static_cast<size_t>(tie_counter_.fetch_add(1, std::memory_order_relaxed) % ties);
      for (size_t i = best; i < candidates.size(); ++i) {
        if (!better(best, i) && nth-- == 0) {
          best = i;
          break;
        }
      }
    }
    if (request.explain != nullptr) {
      if (leg_ == PolicyLeg::kPrefill) {
        request.explain->prefill_tokens_per_second =
            resolve_rates(candidates[best].load, fleet, model_).prefill_tokens_per_second;
      }
      explain(candidates, request, s, best, leg_ == PolicyLeg::kPrefill ? request.explain->prefill : request.explain->decode);
    }
    return best;
  }

  config::PolicyName name() const override { return config::PolicyName::kPredictedLatency; }
  bool needs_load() const override { return true; }

 private:
  static void explain(std::span<const Candidate> candidates, const RequestSummary& request, const Scratch& s,
                      size_t best, LegExplanation& out) {
    out.filled = true;
    out.rows.clear();
    out.chosen = best;
    out.cache_best.reset();
    uint32_t most = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const Candidate& c = candidates[i];
      out.rows.push_back({std::string(c.key), c.outstanding, c.weight, c.load, s.uncached[i], s.predicted[i],
                          s.score[i], s.kv_full[i] != 0});
      const uint32_t matched = request.cache != nullptr ? request.cache->matched(c.key) : 0;
      if (matched > most) {
        most = matched;
        out.cache_best = i;
      }
    }
  }

  const PredictedLatencyModel model_;
  const PolicyLeg leg_;
  std::atomic<uint64_t> tie_counter_{0};
};

}  // namespace

std::unique_ptr<Policy> make_predicted_latency_policy(const config::Topology::Policies::PredictedLatency& config,
                                                      PolicyLeg leg) {
  return std::make_unique<PredictedLatencyPolicy>(config, leg);
}

}  // namespace pdr::router
