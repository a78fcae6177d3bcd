#include "router/policies/predicted_latency.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "router/policies/prompt_tokens.h"

namespace pdr::router {
namespace {

using config::PolicyName;

// Owns the key strings the Candidate views point into.
struct Fleet {
  std::vector<std::string> keys;
  std::vector<Candidate> candidates;
  explicit Fleet(size_t n) {
    for (size_t i = 0; i < n; ++i) keys.push_back("127.0.20." + std::to_string(i + 1) + ":8000");
    for (size_t i = 0; i < n; ++i) candidates.push_back({keys[i], 0, 1, {}});
  }
  std::span<const Candidate> span() const { return candidates; }
};

config::Topology::Policies::PredictedLatency config_with_rate(uint32_t tokens_per_second) {
  config::Topology::Policies::PredictedLatency c;
  c.default_prefill_tokens_per_second = tokens_per_second;
  c.kv_transfer_ns_per_token = 0;
  return c;
}

config::Topology::Policies policies(const config::Topology::Policies::PredictedLatency& c) {
  config::Topology::Policies p;
  p.predicted_latency = c;
  return p;
}

PromptTokens tokens(uint64_t n) {
  PromptTokens p;
  p.count = n;
  p.bytes = n * 4;
  p.source = PromptTokens::Source::kTokenIds;
  return p;
}

CacheHits hits_on(std::string key, uint32_t matched, uint32_t prompt) {
  CacheHits h;
  h.source = CacheHits::Source::kKvEvents;
  h.prompt_units = prompt;
  h.nodes.push_back({std::move(key), matched});
  return h;
}

// A request of `prompt` (with `hits`, when given) whose pick explains itself into *explanation.
RequestSummary explained(const PromptTokens& prompt, RouteExplanation* explanation, const CacheHits* hits = nullptr) {
  RequestSummary r;
  r.prompt = &prompt;
  r.cache = hits;
  r.explain = explanation;
  return r;
}

// ---- the cost model --------------------------------------------------------------------------

TEST(PredictedLatencyModel, TtftIsQueuedPlusUncachedOverRatePlusTransfer) {
  PredictedLatencyModel m;
  m.kv_transfer_seconds_per_token = 1e-6;
  CandidateLoad load;
  load.queued_prefill_tokens = 3000;
  const ResolvedRates rates{1000, 0.01};
  // (3000 queued + 2000 - 500 cached) / 1000 + 2000 * 1 us
  EXPECT_NEAR(predict_ttft(load, rates, 2000, 500, m), 4.5 + 0.002, 1e-12);
  // A hit larger than the prompt (a stale index) never makes the uncached part negative.
  EXPECT_NEAR(predict_ttft(load, rates, 2000, 5000, m), 3.0 + 0.002, 1e-12);
}

TEST(PredictedLatencyModel, TpotGrowsWithSequencesAndKvAndPenalisesAFullCache) {
  PredictedLatencyModel m;
  m.decode_step_seconds_per_sequence = 1e-4;
  m.decode_step_seconds_per_kv_token = 1e-8;
  m.kv_capacity_tokens = 10000;
  m.kv_full_penalty_seconds = 1.0;
  const ResolvedRates rates{1000, 0.005};
  CandidateLoad idle;
  bool full = true;
  EXPECT_NEAR(predict_tpot(idle, rates, 1000, m, &full), 0.005 + 1e-4 + 1e-5, 1e-12);
  EXPECT_FALSE(full);
  CandidateLoad busy;
  busy.decode_sequences = 9;
  busy.kv_tokens = 8000;
  EXPECT_NEAR(predict_tpot(busy, rates, 1000, m, &full), 0.005 + 1e-3 + 9e-5, 1e-12);
  EXPECT_FALSE(full);
  // 8000 + 2001 > 10000: the engine would preempt.
  EXPECT_NEAR(predict_tpot(busy, rates, 2001, m, &full), 0.005 + 1e-3 + 1.0001e-4 + 1.0, 1e-9);
  EXPECT_TRUE(full);
}

TEST(PredictedLatencyModel, TpotCountsAPromptTheNodeComputesItself) {
  // A decode serving a request alone computes its prompt in the same steps as its decodes: each
  // step carries a chunk of up to step_token_budget tokens of it until it is done.
  PredictedLatencyModel m;
  m.decode_step_seconds_per_sequence = 0;
  m.decode_step_seconds_per_kv_token = 0;
  m.step_token_budget = 8192;
  const ResolvedRates rates{10000, 0.005};
  CandidateLoad computing;
  computing.queued_prefill_tokens = 2000;
  EXPECT_NEAR(predict_tpot(computing, rates, 100, m), 0.005 + 0.2, 1e-12);
  computing.queued_prefill_tokens = 50000;  // a step is one chunk, not the whole prompt
  EXPECT_NEAR(predict_tpot(computing, rates, 100, m), 0.005 + 0.8192, 1e-12);
}

TEST(PredictedLatencyModel, TpotCountsWhatTheNodeReportsOfOtherClients) {
  PredictedLatencyModel m;
  m.decode_step_seconds_per_sequence = 1e-4;
  m.decode_step_seconds_per_kv_token = 1e-8;
  m.kv_capacity_tokens = 10000;
  m.kv_full_penalty_seconds = 1.0;
  const ResolvedRates rates{1000, 0.005};
  CandidateLoad ours;
  ours.decode_sequences = 1;
  ours.kv_tokens = 1000;
  bool full = true;
  const double alone = predict_tpot(ours, rates, 1000, m, &full);
  // Another replica's 8 sequences step with ours; their KV shows in the node's usage only.
  CandidateLoad shared = ours;
  shared.other_requests = 8;
  shared.kv_cache_usage = 0.95;
  EXPECT_NEAR(predict_tpot(shared, rates, 1000, m, &full) - alone, 8e-4 + (9500 - 1000) * 1e-8 + 1.0, 1e-9);
  EXPECT_TRUE(full);  // 9500 held + 1000 > 10000
  // A usage below the ledger's own estimate (read before our legs arrived) changes nothing.
  shared.other_requests = 0;
  shared.kv_cache_usage = 0.01;
  EXPECT_NEAR(predict_tpot(shared, rates, 1000, m, &full), alone, 1e-12);
  EXPECT_FALSE(full);
  // Per DP rank, as the ledger's figures are.
  Candidate c{"n", 0, 2, {}};
  c.load.other_requests = 5;
  EXPECT_EQ(per_rank(c).other_requests, 3u);
}

TEST(PredictedLatencyModel, ColdStartTakesTheFleetMeanThenTheDefaults) {
  PredictedLatencyModel m;
  m.default_prefill_tokens_per_second = 111;
  m.default_decode_step_seconds = 0.222;
  Fleet f(3);
  // Nobody measured: the topology's defaults.
  ResolvedRates none = resolve_rates(f.candidates[0].load, fleet_rates(f.span()), m);
  EXPECT_EQ(none.prefill_tokens_per_second, 111);
  EXPECT_EQ(none.decode_step_seconds, 0.222);
  // Two measured: the unmeasured one takes their mean; so do the measured ones for the prefill
  // rate (the fleet's, by default), while a decode step stays the node's own.
  f.candidates[1].load.prefill_tokens_per_second = 1000;
  f.candidates[2].load.prefill_tokens_per_second = 3000;
  f.candidates[2].load.decode_step_seconds = 0.01;
  f.candidates[1].load.decode_step_seconds = 0.03;
  const ResolvedRates fleet = fleet_rates(f.span());
  EXPECT_EQ(resolve_rates(f.candidates[0].load, fleet, m).prefill_tokens_per_second, 2000);
  EXPECT_EQ(resolve_rates(f.candidates[0].load, fleet, m).decode_step_seconds, 0.02);
  EXPECT_EQ(resolve_rates(f.candidates[1].load, fleet, m).prefill_tokens_per_second, 2000);
  EXPECT_EQ(resolve_rates(f.candidates[1].load, fleet, m).decode_step_seconds, 0.03);
  // prefill_rate: node: the measured keep their own.
  m.prefill_rate_per_node = true;
  EXPECT_EQ(resolve_rates(f.candidates[0].load, fleet, m).prefill_tokens_per_second, 2000);
  EXPECT_EQ(resolve_rates(f.candidates[1].load, fleet, m).prefill_tokens_per_second, 1000);
  EXPECT_EQ(resolve_rates(f.candidates[2].load, fleet, m).prefill_tokens_per_second, 3000);
}

TEST(PredictedLatencyPolicy, IdenticalNodesArePredictedAtTheFleetsRateUnlessPerNode) {
  // Node 0 measured 2000 tokens/s with 3000 queued, node 1 1000 tokens/s with 2000 queued (its
  // mix: tokens after long cached prefixes). At the fleet's 1500 the shorter queue wins; each at
  // its own rate node 0 looks 0.5 s sooner and would take the work.
  auto choice = [](bool per_node) {
    config::Topology::Policies::PredictedLatency c = config_with_rate(1000);
    c.fleet_work_weight = 0;
    c.prefill_rate_per_node = per_node;
    auto policy = make_policy(PolicyName::kPredictedLatency, 1, policies(c), PolicyLeg::kPrefill);
    Fleet f(2);
    f.candidates[0].load.prefill_tokens_per_second = 2000;
    f.candidates[0].load.queued_prefill_tokens = 3000;
    f.candidates[1].load.prefill_tokens_per_second = 1000;
    f.candidates[1].load.queued_prefill_tokens = 2000;
    const PromptTokens prompt = tokens(1000);
    RequestSummary r;
    r.prompt = &prompt;
    return policy->pick(f.span(), r);
  };
  EXPECT_EQ(choice(false), 1u);  // 2.0 s vs 2.67 s
  EXPECT_EQ(choice(true), 0u);   // 2.0 s vs 3.0 s
}

TEST(PredictedLatencyModel, DpRanksShareTheNodesLoad) {
  Candidate wide{"127.0.20.1:8000", 0, 4, {}};
  wide.load.queued_prefill_tokens = 4000;
  wide.load.decode_sequences = 8;
  wide.load.kv_tokens = 40000;
  const CandidateLoad rank = per_rank(wide);
  EXPECT_EQ(rank.queued_prefill_tokens, 1000u);
  EXPECT_EQ(rank.decode_sequences, 2u);
  EXPECT_EQ(rank.kv_tokens, 10000u);
  // Figures already of the rank the leg goes to are taken as they are; other clients' requests
  // (the node's scraped total) are still shared out.
  Candidate next = wide;
  next.load.of_next_rank = true;
  next.load.other_requests = 8;
  EXPECT_EQ(per_rank(next).queued_prefill_tokens, 4000u);
  EXPECT_EQ(per_rank(next).kv_tokens, 40000u);
  EXPECT_EQ(per_rank(next).other_requests, 2u);
  Candidate odd{"127.0.20.2:8000", 0, 4, {}};
  odd.load.decode_sequences = 1;  // rounds up: the rank that has it is not idle
  EXPECT_EQ(per_rank(odd).decode_sequences, 1u);
}

// ---- the policy ------------------------------------------------------------------------------

// Node 0 holds `cached` of a 4000-token prompt and has `queued` tokens waiting; node 1 is idle
// and cold. Rate 1000 tokens/s on both.
size_t prefill_choice(uint64_t queued, uint32_t cached, uint32_t fleet_work_weight = 0) {
  config::Topology::Policies::PredictedLatency c = config_with_rate(1000);
  c.fleet_work_weight = fleet_work_weight;
  auto policy = make_policy(PolicyName::kPredictedLatency, 1, policies(c), PolicyLeg::kPrefill);
  Fleet f(2);
  f.candidates[0].load.queued_prefill_tokens = queued;
  f.candidates[0].outstanding = 3;
  const PromptTokens prompt = tokens(4000);
  const CacheHits hits = hits_on(f.keys[0], cached, 4000);
  RequestSummary r;
  r.prompt = &prompt;
  r.cache = &hits;
  return policy->pick(f.span(), r);
}

TEST(PredictedLatencyPolicy, ACacheHitWinsExactlyWhenItPays) {
  // Weight 0, this request's own TTFT alone. Hot node: 3000 cached saves 3 s; its queue costs
  // queued / 1000 s.
  EXPECT_EQ(prefill_choice(0, 3000), 0u);     // 1 s vs 4 s
  EXPECT_EQ(prefill_choice(2500, 3000), 0u);  // 3.5 s vs 4 s: the hit still pays
  EXPECT_EQ(prefill_choice(3500, 3000), 1u);  // 4.5 s vs 4 s: the queue costs more than the hit saves
  EXPECT_EQ(prefill_choice(9000, 3000), 1u);
  EXPECT_EQ(prefill_choice(0, 0), 1u);        // no hit: equal prediction, the less loaded wins
}

TEST(PredictedLatencyPolicy, TheFleetWorkOfAMissKeepsTheHotNodeLonger) {
  // Weight 8: the hot node's score is queued / 1000 + 9 x 1 s, the cold one's 9 x 4 s; the hot
  // node is kept until its queue costs 27 s, not 3 s as with its TTFT alone.
  EXPECT_EQ(prefill_choice(3500, 3000, 8), 0u);
  EXPECT_EQ(prefill_choice(26500, 3000, 8), 0u);
  EXPECT_EQ(prefill_choice(27500, 3000, 8), 1u);
  EXPECT_EQ(prefill_choice(0, 0, 8), 1u);  // no hit anywhere: equal work, the shorter queue wins
  // The score is the TTFT plus the weight times the request's own work at the node's rate.
  PredictedLatencyModel m;
  m.fleet_work_weight = 8;
  EXPECT_NEAR(prefill_score(2.0, ResolvedRates{1000, 0}, 500, m), 6.0, 1e-9);
  m.fleet_work_weight = 0;
  EXPECT_NEAR(prefill_score(2.0, ResolvedRates{1000, 0}, 500, m), 2.0, 1e-9);
}

TEST(PredictedLatencyPolicy, ExplainsItsChoiceAndTheCacheBest) {
  auto policy = make_policy(PolicyName::kPredictedLatency, 1, policies(config_with_rate(1000)),
                            PolicyLeg::kPrefill);
  Fleet f(3);
  f.candidates[1].load.queued_prefill_tokens = 40000;
  const PromptTokens prompt = tokens(4000);
  const CacheHits hits = hits_on(f.keys[1], 3000, 4000);
  RouteExplanation explanation;
  RequestSummary r = explained(prompt, &explanation, &hits);
  const size_t chosen = policy->pick(f.span(), r);
  EXPECT_NE(chosen, 1u);
  const LegExplanation& e = explanation.prefill;
  ASSERT_TRUE(e.filled);
  EXPECT_FALSE(explanation.decode.filled);
  ASSERT_EQ(e.rows.size(), 3u);
  EXPECT_EQ(e.chosen, chosen);
  ASSERT_TRUE(e.cache_best.has_value());
  EXPECT_EQ(*e.cache_best, 1u);
  EXPECT_EQ(e.rows[1].uncached_tokens, 1000u);
  // The predictions are the TTFTs; the scores add 8 x each node's own work (1 s and 4 s).
  EXPECT_NEAR(e.rows[1].predicted_seconds, 41.0, 1e-9);
  EXPECT_NEAR(e.rows[0].predicted_seconds, 4.0, 1e-9);
  EXPECT_NEAR(e.rows[1].score, 49.0, 1e-9);
  EXPECT_NEAR(e.rows[0].score, 36.0, 1e-9);
  EXPECT_EQ(e.rows[1].load.queued_prefill_tokens, 40000u);
}

TEST(PredictedLatencyPolicy, DecodeAvoidsAFullKvCache) {
  config::Topology::Policies::PredictedLatency c;
  c.kv_capacity_tokens = 10000;
  auto policy = make_policy(PolicyName::kPredictedLatency, 1, policies(c), PolicyLeg::kDecode);
  Fleet f(2);
  // Node 0: fewer sequences but nearly full; node 1: more sequences, room to spare.
  f.candidates[0].load.decode_sequences = 2;
  f.candidates[0].load.kv_tokens = 9500;
  f.candidates[1].load.decode_sequences = 6;
  f.candidates[1].load.kv_tokens = 8000;
  const PromptTokens prompt = tokens(1000);
  RequestSummary r;
  r.prompt = &prompt;
  EXPECT_EQ(policy->pick(f.span(), r), 1u);
  // A small prompt fits on node 0, whose step is then the cheaper one.
  const PromptTokens small = tokens(100);
  r.prompt = &small;
  EXPECT_EQ(policy->pick(f.span(), r), 0u);
}

TEST(PredictedLatencyPolicy, DecodeAvoidsANodeComputingAPromptAtThePrefillsRate) {
  auto policy = make_policy(PolicyName::kPredictedLatency, 1, policies(config::Topology::Policies::PredictedLatency{}),
                            PolicyLeg::kDecode);
  Fleet f(2);
  // Node 0 computes a 4,000-token prompt (a request it serves alone); node 1 runs 40 decodes.
  f.candidates[0].load.queued_prefill_tokens = 4000;
  f.candidates[1].load.decode_sequences = 40;
  const PromptTokens prompt = tokens(1000);
  RouteExplanation explanation;
  RequestSummary r = explained(prompt, &explanation);
  // At the prefill's rate (200,000 tokens/s: 20 ms for the prompt), node 0's next steps cost
  // more than 39 more sequences on node 1 (0.7 ms).
  explanation.prefill_tokens_per_second = 200000;
  EXPECT_EQ(policy->pick(f.span(), r), 1u);
  EXPECT_NEAR(explanation.decode.rows[0].predicted_seconds, 0.0075 + 18e-6 + 45e-9 * 1000 + 0.02, 1e-9);
  // Without the queued prompt node 0 wins again.
  f.candidates[0].load.queued_prefill_tokens = 0;
  EXPECT_EQ(policy->pick(f.span(), r), 0u);
}

TEST(PredictedLatencyPolicy, ThePrefillPickRecordsTheRateItPredictedAt) {
  auto policy = make_policy(PolicyName::kPredictedLatency, 1, policies(config_with_rate(1000)),
                            PolicyLeg::kPrefill);
  Fleet f(2);
  f.candidates[0].load.prefill_tokens_per_second = 3000;
  f.candidates[1].load.prefill_tokens_per_second = 5000;
  const PromptTokens prompt = tokens(100);
  RouteExplanation explanation;
  RequestSummary r = explained(prompt, &explanation);
  policy->pick(f.span(), r);
  EXPECT_DOUBLE_EQ(explanation.prefill_tokens_per_second, 4000);  // the fleet's mean
}

TEST(PredictedLatencyPolicy, DpRanksCountAsParallelCapacity) {
  auto policy = make_policy(PolicyName::kPredictedLatency, 1, policies(config_with_rate(1000)),
                            PolicyLeg::kPrefill);
  Fleet f(2);
  // 4 ranks with 6000 queued (1500 each) beat 1 rank with 2000 queued.
  f.candidates[0].weight = 4;
  f.candidates[0].load.queued_prefill_tokens = 6000;
  f.candidates[1].load.queued_prefill_tokens = 2000;
  const PromptTokens prompt = tokens(100);
  RequestSummary r;
  r.prompt = &prompt;
  EXPECT_EQ(policy->pick(f.span(), r), 0u);
}

TEST(PredictedLatencyPolicy, IdleDecodesTieToTheOneHoldingMostOfThePrompt) {
  auto policy = make_policy(PolicyName::kPredictedLatency, 1, {}, PolicyLeg::kDecode);
  Fleet f(3);
  const PromptTokens prompt = tokens(4000);
  const CacheHits hits = hits_on(f.keys[2], 3000, 4000);
  RouteExplanation explanation;
  RequestSummary r = explained(prompt, &explanation, &hits);
  // Equal predictions (an idle fleet): the decode that lacks the least of the prompt pulls the
  // fewest blocks, every time, instead of the decodes taking turns.
  for (int i = 0; i < 6; ++i) EXPECT_EQ(policy->pick(f.span(), r), 2u);
  EXPECT_EQ(explanation.decode.rows[2].uncached_tokens, 1000u);
  EXPECT_EQ(explanation.decode.rows[0].uncached_tokens, 4000u);
  // A prediction that differs still decides first.
  f.candidates[2].load.decode_sequences = 50;
  EXPECT_NE(policy->pick(f.span(), r), 2u);
}

TEST(PredictedLatencyPolicy, AnIdleFleetRotates) {
  auto policy = make_policy(PolicyName::kPredictedLatency, 1, {}, PolicyLeg::kPrefill);
  EXPECT_TRUE(policy->needs_load());
  EXPECT_FALSE(make_policy(PolicyName::kRoundRobin, 1)->needs_load());
  EXPECT_FALSE(make_policy(PolicyName::kLeastOutstanding, 1)->needs_load());
  Fleet f(4);
  std::map<size_t, int> seen;
  for (int i = 0; i < 400; ++i) ++seen[policy->pick(f.span(), RequestSummary{})];
  ASSERT_EQ(seen.size(), 4u);
  for (auto& [index, n] : seen) EXPECT_EQ(n, 100) << index;
}

}  // namespace
}  // namespace pdr::router
