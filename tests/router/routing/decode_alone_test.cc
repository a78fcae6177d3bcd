#include "router/routing/decode_alone.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::router::routing {
namespace {

const proto::Dialect* nixl() { return proto::dialect_for(proto::Connector::kNixl, proto::TransferMode::kNone); }
const proto::Dialect* mooncake() {
  return proto::dialect_for(proto::Connector::kMooncake, proto::TransferMode::kNone);
}

config::Topology::ConditionalDisaggregation config(uint32_t max_prompt_tokens, uint32_t min_cached_percent) {
  config::Topology::ConditionalDisaggregation c;
  c.enabled = true;
  c.max_prompt_tokens = max_prompt_tokens;
  c.min_cached_percent = min_cached_percent;
  return c;
}

TEST(DecodeAlone, EstimatesTokensWithoutATokenizer) {
  EXPECT_EQ(estimated_prompt_tokens("[1,2,3]"), 3u);
  EXPECT_EQ(estimated_prompt_tokens("\"" + std::string(398, 'a') + "\""), 100u);
  EXPECT_EQ(estimated_prompt_tokens("\"\""), 1u);
}

TEST(DecodeAlone, ShortPromptsGoToTheDecodeAlone) {
  ASSERT_NE(nixl(), nullptr);
  EXPECT_EQ(decode_alone_reason(config(8, 0), nixl(), "[1,2,3,4,5,6,7,8]", nullptr, "127.0.32.1:1"),
            DecodeAloneReason::kShortPrompt);
  EXPECT_EQ(decode_alone_reason(config(8, 0), nixl(), "[1,2,3,4,5,6,7,8,9]", nullptr, "127.0.32.1:1"),
            std::nullopt);
  EXPECT_EQ(decode_alone_reason(config(8, 0), nixl(), "\"a short text\"", nullptr, "127.0.32.1:1"),
            DecodeAloneReason::kShortPrompt);
}

TEST(DecodeAlone, ADecodeHoldingNearlyAllOfThePromptServesItAlone) {
  CacheHits hits;
  hits.prompt_units = 100;
  hits.nodes = {{"127.0.32.1:1", 95}, {"127.0.32.2:1", 50}};
  const std::string prompt = "\"" + std::string(400, 'x') + "\"";
  EXPECT_EQ(decode_alone_reason(config(0, 90), nixl(), prompt, &hits, "127.0.32.1:1"), DecodeAloneReason::kCached);
  EXPECT_EQ(decode_alone_reason(config(0, 90), nixl(), prompt, &hits, "127.0.32.2:1"), std::nullopt);
  EXPECT_EQ(decode_alone_reason(config(0, 90), nixl(), prompt, nullptr, "127.0.32.1:1"), std::nullopt);
}

TEST(DecodeAlone, NeverWhenOffOrWhenTheDecodeCannotComputeAlone) {
  auto off = config(1000, 1);
  off.enabled = false;
  EXPECT_EQ(decode_alone_reason(off, nixl(), "[1]", nullptr, "127.0.32.1:1"), std::nullopt);
  ASSERT_NE(mooncake(), nullptr);
  EXPECT_EQ(mooncake()->without_kv, nullptr);
  EXPECT_EQ(decode_alone_reason(config(1000, 0), mooncake(), "[1]", nullptr, "127.0.32.1:1"), std::nullopt);
  EXPECT_EQ(decode_alone_reason(config(1000, 0), nullptr, "[1]", nullptr, "127.0.32.1:1"), std::nullopt);
  EXPECT_EQ(decode_alone_reason(config(0, 0), nixl(), "[1]", nullptr, "127.0.32.1:1"), std::nullopt);
}


// The explanation predicted_latency leaves for a pair: one prefill predicted `prefill_ttft`
// seconds at 10,000 tokens/s, of which all but 0.1 s are prompts queued ahead, and two decodes,
// the first chosen.
RouteExplanation explained(double prefill_ttft, CandidateLoad chosen_decode = {}, CandidateLoad other_decode = {}) {
  RouteExplanation e;
  e.prefill.filled = true;
  CandidateLoad queue;
  queue.queued_prefill_tokens = static_cast<uint64_t>((prefill_ttft - 0.1) * 10000);
  e.prefill.rows.push_back({"127.0.33.1:1", 0, 1, queue, 1000, prefill_ttft, prefill_ttft, false});
  e.decode.filled = true;
  e.decode.rows.push_back({"127.0.33.2:1", 0, 1, chosen_decode, 0, 0.01, 0.01, false});
  e.decode.rows.push_back({"127.0.33.3:1", 0, 1, other_decode, 0, 0.01, 0.01, false});
  e.prefill_tokens_per_second = 10000;
  return e;
}

const config::Topology::Policies::PredictedLatency kNoSlo{};

config::Topology::ConditionalDisaggregation busy_after(uint32_t ms) {
  config::Topology::ConditionalDisaggregation c;
  c.enabled = true;
  c.prefill_busy_ms = ms;
  return c;
}

TEST(DecodeAloneWhenBusy, AnIdleDecodeComputesThePromptWhenThePrefillQueueIsLonger) {
  // 5,000 uncached tokens on the decode: 0.5 s at the prefill's rate, against 2 s predicted on the
  // prefill (its queue).
  const auto alone = decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), explained(2.0), 5000);
  ASSERT_TRUE(alone.has_value());
  EXPECT_DOUBLE_EQ(*alone, 0.5);
  // Not sooner: the prefill keeps it.
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), explained(2.0), 25000), std::nullopt);
  // The prefill's queue is under prefill_busy_ms: P/D as usual, however idle the decode.
  EXPECT_EQ(decode_alone_when_busy(busy_after(1901), kNoSlo, nixl(), explained(2.0), 5000), std::nullopt);
  EXPECT_TRUE(decode_alone_when_busy(busy_after(1899), kNoSlo, nixl(), explained(2.0), 5000).has_value());
  // A long prompt on an idle prefill is no reason: its queue is empty, whatever its TTFT.
  RouteExplanation idle = explained(2.0);
  idle.prefill.rows[0].load.queued_prefill_tokens = 0;
  EXPECT_EQ(decode_alone_when_busy(busy_after(1), kNoSlo, nixl(), idle, 5000), std::nullopt);
  // Per DP rank: 19,000 tokens queued over 2 ranks are 0.95 s each.
  RouteExplanation ranks = explained(2.0);
  ranks.prefill.rows[0].weight = 2;
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), ranks, 5000), std::nullopt);
  EXPECT_TRUE(decode_alone_when_busy(busy_after(900), kNoSlo, nixl(), ranks, 5000).has_value());
}

TEST(DecodeAloneWhenBusy, NeverSlowsAnotherRequest) {
  CandidateLoad running;
  running.decode_sequences = 1;  // a decode streaming there would stall behind the prompt's steps
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), explained(2.0, running), 5000), std::nullopt);
  CandidateLoad computing;
  computing.queued_prefill_tokens = 100;  // already computing a prompt of its own
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), explained(2.0, computing), 5000), std::nullopt);
  CandidateLoad others;
  others.other_requests = 2;  // the node's own page: other clients' requests run there
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), explained(2.0, others), 5000), std::nullopt);
  // The other decode is computing a prompt: this one stays free for the P/D decodes.
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), explained(2.0, {}, computing), 5000),
            std::nullopt);
  // The other decode merely decoding is fine: P/D decodes can go there.
  EXPECT_TRUE(decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), explained(2.0, {}, running), 5000).has_value());
  // A single decode: nowhere left for the P/D decodes.
  RouteExplanation one = explained(2.0);
  one.decode.rows.pop_back();
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), one, 5000), std::nullopt);
}

config::Topology::Policies::PredictedLatency tpot_slo(uint32_t ms, uint32_t step_token_budget) {
  config::Topology::Policies::PredictedLatency m;
  m.slo_tpot_ms = ms;
  m.step_token_budget = step_token_budget;
  return m;
}

// The decision for `tokens` uncached on the chosen decode of explained(2.0, chosen), the prefill
// queue past 1 s, with a TPOT SLO of `slo_ms` and a 512-token budget.
std::optional<double> with_tpot_slo(uint32_t slo_ms, CandidateLoad chosen, uint64_t tokens = 5000) {
  return decode_alone_when_busy(busy_after(1000), tpot_slo(slo_ms, 512), nixl(), explained(2.0, chosen), tokens);
}

TEST(DecodeAloneWhenBusy, WithATpotSloADecodeStreamingTakesAPromptWhoseChunkKeepsItsStepWithin) {
  CandidateLoad running;
  running.decode_sequences = 3;
  // A 512-token chunk at 10,000 tokens/s is 51.2 ms; with the decode's 10 ms a token, 61.2 ms.
  const auto alone = with_tpot_slo(100, running);
  ASSERT_TRUE(alone.has_value());
  EXPECT_DOUBLE_EQ(*alone, 0.5);
  EXPECT_EQ(with_tpot_slo(61, running), std::nullopt);
  EXPECT_TRUE(with_tpot_slo(62, running));
  // The chunk is the prompt when it is shorter than the budget: 300 tokens, 30 ms.
  EXPECT_TRUE(with_tpot_slo(41, running, 300));
  // The decode's own prediction counts: at 60 ms a token, 111.2 ms.
  RouteExplanation slow = explained(2.0, running);
  slow.decode.rows[0].predicted_seconds = 0.06;
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), tpot_slo(100, 512), nixl(), slow, 5000), std::nullopt);
  // No other decode is needed free: the P/D decodes' own predictions steer them.
  RouteExplanation one = explained(2.0, running, running);
  one.decode.rows.pop_back();
  EXPECT_TRUE(decode_alone_when_busy(busy_after(1000), tpot_slo(100, 512), nixl(), one, 5000));
  // A decode computing a prompt already answers after it: 100 + 5,000 tokens, 0.51 s. Its
  // prediction (10 ms) carries that prompt's 100-token chunk already; this one fills the chunk up
  // to 512 tokens: 41.2 ms more.
  CandidateLoad computing;
  computing.queued_prefill_tokens = 100;
  const auto after = with_tpot_slo(100, computing);
  ASSERT_TRUE(after.has_value());
  EXPECT_DOUBLE_EQ(*after, 0.51);
  EXPECT_EQ(with_tpot_slo(51, computing), std::nullopt);
  EXPECT_TRUE(with_tpot_slo(52, computing));
  // Its queue can make it too late: 16,000 + 5,000 tokens are 2.1 s, against 2 s on the prefill.
  computing.queued_prefill_tokens = 16000;
  EXPECT_EQ(with_tpot_slo(1000, computing), std::nullopt);
  // And the prefill must still be busy and slower.
  EXPECT_EQ(decode_alone_when_busy(busy_after(1901), tpot_slo(100, 512), nixl(), explained(2.0, running), 5000),
            std::nullopt);
  EXPECT_EQ(with_tpot_slo(1000, running, 25000), std::nullopt);
}

TEST(DecodeAloneWhenBusy, AChunkPastTheTpotSloLeavesOnlyTheIdleRule) {
  // 8,192-token budget: the 5,000-token prompt is one 500 ms chunk, past a 100 ms SLO.
  CandidateLoad running;
  running.decode_sequences = 1;
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), tpot_slo(100, 8192), nixl(), explained(2.0, running), 5000),
            std::nullopt);
  EXPECT_TRUE(decode_alone_when_busy(busy_after(1000), tpot_slo(100, 8192), nixl(), explained(2.0), 5000));
}

TEST(DecodeAloneWhenBusy, NeverWhenOffUnpredictedOrTheDecodeCannotComputeAlone) {
  auto off = busy_after(1000);
  off.enabled = false;
  EXPECT_EQ(decode_alone_when_busy(off, kNoSlo, nixl(), explained(2.0), 5000), std::nullopt);
  EXPECT_EQ(decode_alone_when_busy(busy_after(0), kNoSlo, nixl(), explained(2.0), 5000), std::nullopt);
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), kNoSlo, mooncake(), explained(2.0), 5000), std::nullopt);
  RouteExplanation unpredicted = explained(2.0);
  unpredicted.decode.filled = false;  // the decode leg's policy predicts nothing
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), unpredicted, 5000), std::nullopt);
  RouteExplanation no_rate = explained(2.0);
  no_rate.prefill_tokens_per_second = 0;
  EXPECT_EQ(decode_alone_when_busy(busy_after(1000), kNoSlo, nixl(), no_rate, 5000), std::nullopt);
}

}  // namespace
}  // namespace pdr::router::routing
