// The simulated vLLM V1 scheduler (node/sim/engine/scheduler.h) against step sequences
// worked out by hand from vLLM's rules.
#include "node/sim/engine/scheduler.h"

#include <numeric>

#include <gtest/gtest.h>

namespace pdr::node::sim {
namespace {

// Small numbers so each step can be followed by hand: blocks of 4 tokens, and a step-time formula
// whose terms are easy to add up.
EngineProfile small_profile(uint32_t blocks, uint32_t budget, uint32_t seats) {
  EngineProfile p;
  p.block_size = 4;
  p.num_gpu_blocks = blocks;
  p.max_num_batched_tokens = budget;
  p.max_num_seqs = seats;
  p.max_model_len = 1000;
  p.step_overhead_ms = 1;
  p.step_weight_read_ms = 2;
  p.step_ms_per_token = 0.5;
  p.step_ms_per_attention_pair = 0.01;
  p.step_ms_per_context_token = 0.1;
  return p;
}

std::vector<uint32_t> ids(uint32_t count, uint32_t first) {
  std::vector<uint32_t> out(count);
  std::iota(out.begin(), out.end(), first);
  return out;
}

EngineRequestSpec request(uint64_t id, uint32_t prompt, uint32_t max_tokens, uint32_t first_id = 0) {
  EngineRequestSpec spec;
  spec.id = id;
  spec.prompt = ids(prompt, first_id != 0 ? first_id : static_cast<uint32_t>(id * 1000));
  spec.outputs = ids(max_tokens, 900000 + static_cast<uint32_t>(id) * 100);
  return spec;
}

struct Chunk {
  uint64_t id;
  uint32_t tokens;
  uint32_t before;
  bool operator==(const Chunk&) const = default;
};

std::vector<Chunk> chunks(const EngineStep& step) {
  std::vector<Chunk> out;
  for (const ScheduledChunk& c : step.batch) out.push_back({c.id, c.tokens, c.computed_before});
  return out;
}

struct Out {
  uint64_t id;
  uint32_t index;
  bool finished;
  bool operator==(const Out&) const = default;
};

std::vector<Out> outs(const std::vector<EngineToken>& tokens) {
  std::vector<Out> out;
  for (const EngineToken& t : tokens) out.push_back({t.id, t.index, t.finished});
  return out;
}

void PrintTo(const Chunk& c, std::ostream* os) { *os << "{" << c.id << ":" << c.tokens << "@" << c.before << "}"; }
void PrintTo(const Out& o, std::ostream* os) {
  *os << "{" << o.id << "#" << o.index << (o.finished ? " fin" : "") << "}";
}

// The hash vLLM-style chaining gives block `b` of a request's token ids.
uint64_t block_hash_of(const std::vector<uint32_t>& tokens, size_t b, uint32_t bs = 4) {
  std::optional<uint64_t> parent;
  for (size_t i = 0; i <= b; ++i) parent = SimPrefixCache::block_hash(parent, tokens.data() + i * bs, bs);
  return *parent;
}

TEST(EngineScheduler, BudgetGoesToDecodesFirstAndTheRestToAChunkedPrefill) {
  EngineScheduler s(small_profile(100, 10, 8));
  ASSERT_TRUE(s.add(request(1, 3, 5)));
  ASSERT_TRUE(s.add(request(2, 3, 5)));
  EngineStep step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 3, 0}, {2, 3, 0}}));
  // 1 + max(2, 0.5 x 6) + 0.01 x (3 x 1.5 + 3 x 1.5)
  EXPECT_NEAR(step.duration_ms, 4.09, 1e-9);
  EXPECT_EQ(step.admitted.size(), 2u);
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 0, false}, {2, 0, false}}));

  ASSERT_TRUE(s.add(request(3, 20, 2)));
  step = s.schedule();
  // Two decodes take one token each, the new prompt the 8 left.
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 1, 3}, {2, 1, 3}, {3, 8, 0}}));
  // 1 + max(2, 0.5 x 10) + 0.01 x 8 x (0 + 4) + 0.1 x (4 + 4)
  EXPECT_NEAR(step.duration_ms, 7.12, 1e-9);
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 1, false}, {2, 1, false}}));

  step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 1, 4}, {2, 1, 4}, {3, 8, 8}}));
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 2, false}, {2, 2, false}}));
  // The last 4 prompt tokens: the chunk that completes the prompt samples its first output.
  step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 1, 5}, {2, 1, 5}, {3, 4, 16}}));
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 3, false}, {2, 3, false}, {3, 0, false}}));
  EXPECT_EQ(s.stats().running, 3u);
  EXPECT_EQ(s.stats().prompt_tokens, 26u);
  EXPECT_EQ(s.stats().generation_tokens, 9u);
}

TEST(EngineScheduler, SeatsLimitAdmission) {
  EngineScheduler s(small_profile(100, 100, 2));
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(s.add(request(id, 4, 2)));
  EngineStep step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 4, 0}, {2, 4, 0}}));
  EXPECT_EQ(s.stats().waiting, 1u);
  s.complete_step();
  step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 1, 4}, {2, 1, 4}}));
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 1, true}, {2, 1, true}}));
  step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{3, 4, 0}}));
}

TEST(EngineScheduler, OutOfBlocksPreemptsTheNewestRunningRequestsWhichRecomputeFromTheHeadOfWaiting) {
  // 4 usable blocks of 4 tokens: four 4-token prompts fill them.
  EngineScheduler s(small_profile(5, 100, 8));
  ASSERT_TRUE(s.add(request(1, 4, 2)));
  ASSERT_TRUE(s.add(request(2, 4, 2)));
  ASSERT_TRUE(s.add(request(3, 4, 10)));
  ASSERT_TRUE(s.add(request(4, 4, 10)));
  EngineStep step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 4, 0}, {2, 4, 0}, {3, 4, 0}, {4, 4, 0}}));
  EXPECT_EQ(s.stats().free_blocks, 0u);
  s.complete_step();
  s.take_kv_events();
  const std::vector<uint32_t> prompt3 = ids(4, 3000), prompt4 = ids(4, 4000);

  // Each decode needs a second block: 1 preempts the newest (4), 2 the next newest (3).
  step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 1, 4}, {2, 1, 4}}));
  EXPECT_EQ(step.preempted, (std::vector<uint64_t>{4, 3}));
  EXPECT_TRUE(step.admitted.empty());  // no admission in a step that preempted
  const EngineSchedulerStats st = s.stats();
  EXPECT_EQ(st.preemptions, 2u);
  EXPECT_EQ(st.running, 2u);
  EXPECT_EQ(st.waiting, 2u);
  // Their freed blocks went to the queue's tail, 4's first, and were reused (evicted) in that order.
  std::vector<PrefixCacheChange> events = s.take_kv_events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].stored);
  EXPECT_EQ(events[0].hashes, (std::vector<uint64_t>{block_hash_of(prompt4, 0), block_hash_of(prompt3, 0)}));
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 1, true}, {2, 1, true}}));

  // 3 resumes first (head of waiting) and recomputes its prompt and its first output (5 tokens,
  // its own cached block having been evicted), then samples its second output; 4 likewise.
  step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{3, 5, 0}, {4, 5, 0}}));
  EXPECT_TRUE(step.admitted.empty());  // both had been admitted before
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{3, 1, false}, {4, 1, false}}));
  EXPECT_EQ(s.stats().prefix_queries, 16u);  // first lookups only
}

TEST(EngineScheduler, PreemptionStopsWhenTheRequestPreemptsItself) {
  // 2 usable blocks: one request of 8 tokens fills them and cannot grow.
  EngineScheduler s(small_profile(3, 100, 8));
  ASSERT_TRUE(s.add(request(1, 8, 3)));
  EngineStep step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 8, 0}}));
  s.complete_step();
  step = s.schedule();
  EXPECT_TRUE(step.batch.empty());
  EXPECT_EQ(step.preempted, (std::vector<uint64_t>{1}));
  EXPECT_EQ(s.stats().waiting, 1u);
}

TEST(EngineScheduler, PrefixHitIsCappedAtAllButTheLastTokenInFullBlocks) {
  EngineScheduler s(small_profile(100, 100, 8));
  ASSERT_TRUE(s.add(request(1, 8, 1, 500)));
  EXPECT_EQ(chunks(s.schedule()), (std::vector<Chunk>{{1, 8, 0}}));
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 0, true}}));

  // The same 8 tokens: at most (8 - 1) / 4 = 1 block may hit, so 4 tokens are computed.
  ASSERT_TRUE(s.add(request(2, 8, 1, 500)));
  EngineStep step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{2, 4, 4}}));
  ASSERT_EQ(step.admitted.size(), 1u);
  EXPECT_EQ(step.admitted[0].cached_tokens, 4u);
  EXPECT_EQ(step.admitted[0].queried_tokens, 8u);
  // 1 + max(2, 2) + 0.01 x 4 x (4 + 2)
  EXPECT_NEAR(step.duration_ms, 3.24, 1e-9);
  s.complete_step();

  // One token more: both blocks hit and only the ninth token is computed.
  ASSERT_TRUE(s.add(request(3, 9, 1, 500)));
  step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{3, 1, 8}}));
  EXPECT_EQ(step.admitted[0].cached_tokens, 8u);
  s.complete_step();
  const EngineSchedulerStats st = s.stats();
  EXPECT_EQ(st.prefix_queries, 8u + 8u + 9u);
  EXPECT_EQ(st.prefix_hits, 4u + 8u);
}

TEST(EngineScheduler, RemoteKvHoldsBlocksWithoutSeatOrBudgetThenComputesOneToken) {
  EngineScheduler s(small_profile(10, 5, 2));
  ASSERT_TRUE(s.add(request(1, 4, 5)));
  EXPECT_EQ(chunks(s.schedule()), (std::vector<Chunk>{{1, 4, 0}}));
  s.complete_step();
  s.take_kv_events();

  EngineRequestSpec decode = request(2, 8, 3);
  decode.remote_tokens = 8;
  const std::vector<uint32_t> prompt = decode.prompt;
  ASSERT_TRUE(s.add(decode));
  ASSERT_TRUE(s.add(request(3, 4, 1)));
  EngineStep step = s.schedule();
  // 2 takes blocks for its 8 prompt tokens but no token of the budget of 5 and no seat: 3 gets both.
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 1, 4}, {3, 4, 0}}));
  ASSERT_EQ(step.load_remote.size(), 1u);
  EXPECT_EQ(step.load_remote[0].id, 2u);
  EXPECT_EQ(step.load_remote[0].cached_tokens, 0u);
  EngineSchedulerStats st = s.stats();
  EXPECT_EQ(st.running, 2u);
  EXPECT_EQ(st.waiting, 1u);
  EXPECT_EQ(st.free_blocks, 9u - 2u - 1u - 2u);  // 1: 2 blocks (5 tokens), 3: 1, 2: 2
  // Nothing of 2's is announced before its KV is there.
  for (const PrefixCacheChange& c : s.take_kv_events()) {
    EXPECT_NE(c.hashes.front(), block_hash_of(prompt, 0));
  }
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 1, false}, {3, 0, true}}));

  // Not done yet: 2 keeps waiting and 1 decodes alone.
  EXPECT_EQ(chunks(s.schedule()), (std::vector<Chunk>{{1, 1, 5}}));
  s.complete_step();
  s.remote_kv_done(2, true);
  // Now its 7 first tokens count as computed; it takes a seat and computes the 8th.
  step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{1, 1, 6}, {2, 1, 7}}));
  EXPECT_EQ(step.admitted.size(), 1u);
  const std::vector<PrefixCacheChange> events = s.take_kv_events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].hashes, (std::vector<uint64_t>{block_hash_of(prompt, 0)}));  // at the load
  EXPECT_EQ(events[1].hashes, (std::vector<uint64_t>{block_hash_of(prompt, 1)}));  // this step's
  EXPECT_EQ(events[1].parent, block_hash_of(prompt, 0));
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 3, false}, {2, 0, false}}));
  st = s.stats();
  EXPECT_EQ(st.waiting, 0u);
  EXPECT_EQ(st.running, 2u);
  // 2's prompt counts once, when its first output comes.
  EXPECT_EQ(st.prompt_tokens, 4u + 4u + 8u);
}

TEST(EngineScheduler, RemoteKvFailureRecomputesThePrompt) {
  EngineScheduler s(small_profile(10, 100, 4));
  EngineRequestSpec decode = request(1, 8, 2);
  decode.remote_tokens = 8;
  ASSERT_TRUE(s.add(decode));
  EngineStep step = s.schedule();
  EXPECT_TRUE(step.batch.empty());
  EXPECT_EQ(step.load_remote.size(), 1u);
  s.remote_kv_done(1, false);
  EXPECT_EQ(chunks(s.schedule()), (std::vector<Chunk>{{1, 8, 0}}));
}

TEST(EngineScheduler, FreedBlocksAreEvictedLeastRecentlyFreedFirstLastBlockFirst) {
  // 4 usable blocks; two 8-token prompts fill them in turn.
  EngineScheduler s(small_profile(5, 100, 8));
  ASSERT_TRUE(s.add(request(1, 8, 1)));
  s.schedule();
  s.complete_step();
  ASSERT_TRUE(s.add(request(2, 8, 1)));
  s.schedule();
  s.complete_step();
  std::vector<PrefixCacheChange> events = s.take_kv_events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_TRUE(events[0].stored);
  EXPECT_EQ(events[0].hashes.size(), 2u);
  EXPECT_FALSE(events[0].parent.has_value());
  EXPECT_EQ(events[0].tokens, ids(8, 1000));
  EXPECT_EQ(s.stats().cached_blocks, 4u);
  EXPECT_DOUBLE_EQ(s.stats().kv_usage, 0.0);  // idle cached blocks count as free

  // A third prompt needs 2 blocks: the queue's head holds 1's blocks, its last block first.
  ASSERT_TRUE(s.add(request(3, 8, 1)));
  s.schedule();
  EXPECT_DOUBLE_EQ(s.stats().kv_usage, 0.5);
  s.complete_step();
  events = s.take_kv_events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_FALSE(events[0].stored);
  const std::vector<uint32_t> p1 = ids(8, 1000), p2 = ids(8, 2000), p3 = ids(8, 3000);
  EXPECT_EQ(events[0].hashes, (std::vector<uint64_t>{block_hash_of(p1, 1), block_hash_of(p1, 0)}));
  EXPECT_TRUE(events[1].stored);
  EXPECT_EQ(events[1].hashes, (std::vector<uint64_t>{block_hash_of(p3, 0), block_hash_of(p3, 1)}));

  // 2's blocks are still cached: a hit takes them out of the queue. The hitting request's third
  // block comes from the queue's head, 3's last block.
  ASSERT_TRUE(s.add(request(4, 9, 1, 2000)));  // 2's 8 tokens and one more: both blocks hit
  EngineStep step = s.schedule();
  EXPECT_EQ(chunks(step), (std::vector<Chunk>{{4, 1, 8}}));
  events = s.take_kv_events();
  ASSERT_EQ(events.size(), 1u);  // its third block is partial: nothing stored
  EXPECT_FALSE(events[0].stored);
  EXPECT_EQ(events[0].hashes, (std::vector<uint64_t>{block_hash_of(p3, 1)}));
  s.complete_step();
  // Queue now: 3's first block, then 4's blocks last first (its partial one, 2's second, 2's first).
  ASSERT_TRUE(s.add(request(5, 12, 1)));
  s.schedule();
  events = s.take_kv_events();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_FALSE(events[0].stored);
  EXPECT_EQ(events[0].hashes, (std::vector<uint64_t>{block_hash_of(p3, 0), block_hash_of(p2, 1)}));
  EXPECT_TRUE(events[1].stored);
  EXPECT_EQ(events[1].hashes.size(), 3u);
  EXPECT_EQ(s.stats().evicted_blocks, 5u);
}

TEST(EngineScheduler, CancelFreesBlocksWhereverTheRequestIs) {
  EngineScheduler s(small_profile(10, 100, 8));
  ASSERT_TRUE(s.add(request(1, 8, 5)));
  EngineRequestSpec decode = request(2, 8, 2);
  decode.remote_tokens = 8;
  ASSERT_TRUE(s.add(decode));
  s.schedule();
  EXPECT_EQ(s.stats().free_blocks, 9u - 2u - 2u);
  s.cancel(1);  // during its step: it produces nothing at the end
  s.cancel(2);  // waiting for its KV
  EXPECT_TRUE(s.complete_step().empty());
  EXPECT_EQ(s.stats().free_blocks, 9u);
  EXPECT_TRUE(s.idle());
  s.cancel(7);  // unknown: nothing happens
}

TEST(EngineScheduler, HeldBlocksStayReferencedUntilReleased) {
  EngineScheduler s(small_profile(10, 100, 8));
  EngineRequestSpec prefill = request(1, 8, 1);
  prefill.hold_blocks_after_finish = true;
  ASSERT_TRUE(s.add(prefill));
  s.schedule();
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 0, true}}));
  EXPECT_EQ(s.stats().free_blocks, 7u);
  EXPECT_EQ(s.stats().held, 1u);
  s.release(1);
  EXPECT_EQ(s.stats().free_blocks, 9u);
  EXPECT_EQ(s.stats().held, 0u);
}

TEST(EngineScheduler, RefusesPromptsOfMaxModelLenOrMore) {
  EngineProfile p = small_profile(100, 100, 8);
  p.max_model_len = 16;
  EngineScheduler s(p);
  EXPECT_FALSE(s.add(request(1, 16, 1)));
  EXPECT_TRUE(s.add(request(2, 15, 1)));
  EXPECT_FALSE(s.add(request(2, 3, 1)));  // the same id twice
  EngineRequestSpec empty = request(3, 3, 1);
  empty.outputs.clear();
  EXPECT_FALSE(s.add(empty));
}

TEST(EngineScheduler, GenerationStopsAtMaxModelLen) {
  EngineProfile p = small_profile(100, 100, 8);
  p.max_model_len = 6;
  EngineScheduler s(p);
  ASSERT_TRUE(s.add(request(1, 4, 10)));
  s.schedule();
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 0, false}}));
  s.schedule();
  // 4 prompt tokens and 2 outputs make 6 = max_model_len.
  EXPECT_EQ(outs(s.complete_step()), (std::vector<Out>{{1, 1, true}}));
}

TEST(EngineScheduler, DefaultProfileStepTimes) {
  const EngineProfile p;
  // One short decode: the overhead and the weights' read, plus a little context.
  EXPECT_NEAR(step_time_ms(p, {.tokens = 1, .context_tokens = 10}), 7.5 + 4.5e-4, 1e-9);
  // An 8k prompt in one step.
  EXPECT_NEAR(step_time_ms(p, {.tokens = 8192, .attention_pairs = 8192.0 * 4096.0}), 182.510432, 1e-6);
  // 32 decodes of 2k context.
  EXPECT_NEAR(step_time_ms(p, {.tokens = 32, .context_tokens = 32 * 2049}), 10.45056, 1e-6);
}

}  // namespace
}  // namespace pdr::node::sim
