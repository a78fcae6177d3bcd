// EngineScheduler: one simulated vLLM V1 engine (one DP rank of `pdnode sim --engine vllm`), step
// by step: which requests run in each step, how many tokens each computes, how long the step takes
// (node/sim/engine/profile.h), which tokens come out at its end, and which KV blocks get
// cached and evicted on the way (node/sim/engine/block_pool.h). It follows vLLM's
// vllm/v1/core/sched/scheduler.py and vllm/v1/core/kv_cache_manager.py:
//
// - Each request has tokens known (its prompt, then each output once sampled) and tokens computed
//   (their KV exists). A step gives each scheduled request min(what it lacks, budget left) tokens,
//   within --max-num-batched-tokens in all: there are no prefill or decode phases, prefills are
//   chunked, and a decode is simply a request lacking one token.
// - RUNNING requests go first, in admission order. One that cannot get the blocks its new tokens
//   need preempts the newest running request (vLLM's FCFS policy pops running[-1]) by recompute: its
//   blocks are freed, its computed tokens dropped, and it goes back to the head of WAITING; this
//   repeats until the allocation fits or the request preempted itself.
// - Then, only if nothing was preempted in this step, WAITING requests in FCFS order while budget is
//   left and fewer than --max-num-seqs run: a new request looks up its prefix in the cache (full
//   blocks only, at most (tokens - 1) of them, so at least one token is computed), then takes blocks
//   for what it will compute; the first request that cannot get blocks stops admission.
// - A request whose prompt KV comes from another node (a P/D decode: remote_tokens, NIXL's
//   do_remote_prefill) takes blocks for the prompt tokens its cache lacks when admission reaches
//   it, without budget or seat, and waits (counted as waiting) until remote_kv_done(). Its blocks
//   are cached then (vLLM delays caching them until the KV arrived), it counts prompt - 1 tokens as
//   computed, and like any waiting request it then needs a seat and budget to compute the last
//   prompt token, which samples its first output. A failed load recomputes instead (only its own
//   cache hit counts as computed).
// - A request samples its next output when a step leaves all its known tokens computed; it
//   finishes after max tokens outputs (or at max_model_len), and its blocks go back to the free
//   queue, last block first. One with hold_blocks_after_finish keeps them until release() (a
//   P/D prefill keeps its KV until the decode read it).
//
// Hashes of full blocks are SimPrefixCache::block_hash chained over the request's token ids, the
// same names the per-token sim publishes. Prefix-cache counters follow vLLM's Prometheus ones:
// queries and hits in tokens, counted once per request (a preempted request's lookups are not).
//
// Use: add()/cancel()/remote_kv_done()/release() at any time; schedule() then complete_step() for
// each step, never two schedule() calls in a row (an empty batch needs no complete_step()). A
// request cancelled during a step simply produces nothing at its end.
//
// Pure, deterministic and single-threaded: no I/O, no clocks, no locks.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "node/sim/engine/block_pool.h"
#include "node/sim/engine/profile.h"

namespace pdr::node::sim {

struct EngineRequestSpec {
  uint64_t id = 0;
  std::vector<uint32_t> prompt;   // token ids, at least one
  std::vector<uint32_t> outputs;  // the ids it will generate, in order; at least one (max tokens)
  uint32_t remote_tokens = 0;     // leading prompt tokens whose KV another node sends
  bool hold_blocks_after_finish = false;
};

// One request's share of a step: `tokens` computed on top of `computed_before`.
struct ScheduledChunk {
  uint64_t id = 0;
  uint32_t tokens = 0;
  uint32_t computed_before = 0;
};

// A request scheduled for the first time (its queue time ends) and what its cache lookup found.
struct EngineAdmission {
  uint64_t id = 0;
  uint32_t cached_tokens = 0;
  uint32_t queried_tokens = 0;
};

struct EngineStep {
  std::vector<ScheduledChunk> batch;  // running requests first, then newly admitted ones
  StepShape shape;
  double duration_ms = 0;             // modelled; 0 when the batch is empty
  std::vector<EngineAdmission> admitted;
  std::vector<uint64_t> preempted;    // newest first
  std::vector<EngineAdmission> load_remote;  // got blocks for their remote KV: pull it now
};

// An output token sampled at a step's end: the request's output number `index` (from 0).
struct EngineToken {
  uint64_t id = 0;
  uint32_t index = 0;
  bool finished = false;
};

struct EngineSchedulerStats {
  uint32_t running = 0;
  uint32_t waiting = 0;   // waiting for remote KV included
  uint32_t held = 0;      // finished, blocks kept until release()
  double kv_usage = 0;
  uint32_t free_blocks = 0;
  uint64_t cached_blocks = 0;
  uint64_t stored_blocks = 0;
  uint64_t evicted_blocks = 0;
  uint64_t preemptions = 0;
  uint64_t prefix_queries = 0;  // tokens
  uint64_t prefix_hits = 0;     // tokens
  uint64_t prompt_tokens = 0;   // of requests that produced their first output
  uint64_t generation_tokens = 0;
  uint64_t finished = 0;
  uint64_t steps = 0;
};

class EngineScheduler {
 public:
  explicit EngineScheduler(const EngineProfile& profile);
  ~EngineScheduler();
  EngineScheduler(const EngineScheduler&) = delete;
  EngineScheduler& operator=(const EngineScheduler&) = delete;

  // Queues a request at WAITING's tail. False (nothing queued) for an id already known, an empty
  // prompt or output list, or a prompt of max_model_len tokens or more.
  bool add(EngineRequestSpec spec);
  // Forgets a request wherever it is (waiting, running, held), freeing its blocks. Unknown: no-op.
  void cancel(uint64_t id);
  // The pull of a request listed in load_remote ended; seen by the next schedule(). Ignored for a
  // request not waiting for its KV.
  void remote_kv_done(uint64_t id, bool ok);
  // Frees a finished request's held blocks (cancel() does the same).
  void release(uint64_t id) { cancel(id); }

  EngineStep schedule();
  // The step schedule() last returned ran: its outputs, in batch order.
  std::vector<EngineToken> complete_step();

  // KV events since the last call, in order (BlockStored at allocation, BlockRemoved at eviction).
  std::vector<PrefixCacheChange> take_kv_events() { return pool_.take_events(); }
  // vLLM's reset_prefix_cache: false (nothing changes) while any block is in use.
  bool reset_prefix_cache() { return pool_.reset_prefix_cache(); }

  bool idle() const { return requests_.empty(); }
  EngineSchedulerStats stats() const;
  const EngineProfile& profile() const { return profile_; }

 private:
  struct Request;

  bool allocate_slots(Request& r, uint32_t new_tokens, const std::vector<uint32_t>& hit_blocks,
                      uint32_t hit_tokens, bool delay_cache);
  void cache_blocks(Request& r, uint32_t tokens);
  void free_blocks(Request& r);
  void preempt(Request& r);
  void finish_remote_load(Request& r);
  void remove_from_queues(Request& r);

  const EngineProfile profile_;
  EngineBlockPool pool_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::vector<Request*> running_;  // admission order
  std::deque<Request*> waiting_;
  std::vector<ScheduledChunk> in_step_;
  bool stepping_ = false;
  EngineSchedulerStats counters_;
};

}  // namespace pdr::node::sim
