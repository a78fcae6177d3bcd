#include "node/sim/engine/scheduler.h"

#include <algorithm>
#include <cassert>
#include <optional>
#include <span>

#include "node/sim/prefix_cache.h"

namespace pdr::node::sim {

struct EngineScheduler::Request {
  enum class State { kWaiting, kWaitingForRemoteKv, kRunning, kHeld };

  uint64_t id = 0;
  std::vector<uint32_t> tokens;   // prompt, then every output it will produce
  std::vector<uint64_t> hashes;   // of each full block of `tokens`
  uint32_t prompt_len = 0;
  uint32_t max_tokens = 0;
  uint32_t num_tokens = 0;        // known: the prompt and the outputs sampled so far
  uint32_t num_computed = 0;
  std::vector<uint32_t> blocks;
  uint32_t cached_blocks = 0;     // blocks[0..cached_blocks) carry their hash
  State state = State::kWaiting;
  uint32_t remote_tokens = 0;     // 0 once the remote load was asked for
  uint32_t local_hit_tokens = 0;  // what the cache held when the remote load was asked for
  bool remote_done = false;
  bool remote_ok = false;
  bool admitted = false;
  bool looked_up = false;         // its first cache lookup was counted
  uint32_t preemptions = 0;
  bool hold = false;
};

EngineScheduler::EngineScheduler(const EngineProfile& profile)
    : profile_(profile), pool_(profile.num_gpu_blocks) {}

EngineScheduler::~EngineScheduler() = default;

bool EngineScheduler::add(EngineRequestSpec spec) {
  if (spec.prompt.empty() || spec.outputs.empty() || spec.prompt.size() >= profile_.max_model_len ||
      requests_.contains(spec.id)) {
    return false;
  }
  auto r = std::make_unique<Request>();
  r->id = spec.id;
  r->prompt_len = static_cast<uint32_t>(spec.prompt.size());
  r->max_tokens = static_cast<uint32_t>(spec.outputs.size());
  r->num_tokens = r->prompt_len;
  r->remote_tokens = std::min(spec.remote_tokens, r->prompt_len);
  r->hold = spec.hold_blocks_after_finish;
  r->tokens = std::move(spec.prompt);
  r->tokens.insert(r->tokens.end(), spec.outputs.begin(), spec.outputs.end());
  const uint32_t bs = profile_.block_size;
  r->hashes.reserve(r->tokens.size() / bs);
  std::optional<uint64_t> parent;
  for (size_t b = 0; (b + 1) * bs <= r->tokens.size(); ++b) {
    parent = SimPrefixCache::block_hash(parent, r->tokens.data() + b * bs, bs);
    r->hashes.push_back(*parent);
  }
  waiting_.push_back(r.get());
  requests_.emplace(r->id, std::move(r));
  return true;
}

void EngineScheduler::cancel(uint64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  remove_from_queues(r);
  free_blocks(r);
  requests_.erase(it);
}

void EngineScheduler::remote_kv_done(uint64_t id, bool ok) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->state != Request::State::kWaitingForRemoteKv) return;
  it->second->remote_done = true;
  it->second->remote_ok = ok;
}

void EngineScheduler::remove_from_queues(Request& r) {
  if (r.state == Request::State::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), &r));
  } else if (r.state != Request::State::kHeld) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), &r));
  }
}

void EngineScheduler::free_blocks(Request& r) {
  // vLLM frees a request's blocks last block first, so its tail is evicted before its head.
  std::reverse(r.blocks.begin(), r.blocks.end());
  pool_.release(r.blocks);
  r.blocks.clear();
  r.cached_blocks = 0;
}

void EngineScheduler::cache_blocks(Request& r, uint32_t tokens) {
  const uint32_t bs = profile_.block_size;
  const uint32_t full = std::min<uint32_t>(tokens / bs, static_cast<uint32_t>(r.hashes.size()));
  if (full <= r.cached_blocks) return;
  PrefixCacheChange change{.stored = true};
  if (r.cached_blocks > 0) change.parent = r.hashes[r.cached_blocks - 1];
  for (uint32_t b = r.cached_blocks; b < full; ++b) {
    pool_.set_hash(r.blocks[b], r.hashes[b]);
    change.hashes.push_back(r.hashes[b]);
  }
  change.tokens.assign(r.tokens.begin() + size_t{r.cached_blocks} * bs, r.tokens.begin() + size_t{full} * bs);
  r.cached_blocks = full;
  pool_.note_stored(std::move(change));
}

// kv_cache_manager.allocate_slots: room for `new_tokens` beyond what is computed (plus the cache
// hit `hit_blocks`, which the request takes first), or false with nothing changed.
bool EngineScheduler::allocate_slots(Request& r, uint32_t new_tokens,
                                     const std::vector<uint32_t>& hit_blocks, uint32_t hit_tokens,
                                     bool delay_cache) {
  const uint32_t bs = profile_.block_size;
  const uint32_t computed = r.num_computed + hit_tokens;
  const uint32_t need_tokens = std::min(computed + new_tokens, profile_.max_model_len);
  const uint32_t need_blocks = (need_tokens + bs - 1) / bs;
  const uint32_t held = static_cast<uint32_t>(r.blocks.size() + hit_blocks.size());
  const uint32_t new_blocks = need_blocks > held ? need_blocks - held : 0;
  // A hit block nobody references sits in the free queue: taking it costs a free block too.
  if (new_blocks + pool_.count_unreferenced(hit_blocks) > pool_.free_blocks()) return false;
  if (!hit_blocks.empty()) {
    pool_.touch(hit_blocks);
    r.blocks.insert(r.blocks.end(), hit_blocks.begin(), hit_blocks.end());
    r.cached_blocks = static_cast<uint32_t>(hit_blocks.size());
  }
  pool_.allocate(new_blocks, &r.blocks);
  if (!delay_cache) cache_blocks(r, std::min(computed + new_tokens, r.num_tokens));
  return true;
}

void EngineScheduler::preempt(Request& r) {
  free_blocks(r);
  r.num_computed = 0;
  r.state = Request::State::kWaiting;
  ++r.preemptions;
  ++counters_.preemptions;
  waiting_.push_front(&r);
}

// scheduler._update_waiting_for_remote_kv: the pulled KV counts as computed, all but the last
// prompt token (the step that computes it samples the first output), and its blocks get cached.
void EngineScheduler::finish_remote_load(Request& r) {
  uint32_t computed = r.local_hit_tokens;
  if (r.remote_ok) {
    computed = std::min<uint32_t>(static_cast<uint32_t>(r.blocks.size()) * profile_.block_size, r.num_tokens);
    if (computed == r.num_tokens) --computed;
  }
  cache_blocks(r, computed);
  r.num_computed = computed;
  r.state = Request::State::kWaiting;
}

EngineStep EngineScheduler::schedule() {
  assert(!stepping_);
  EngineStep step;
  uint32_t budget = profile_.max_num_batched_tokens;
  const uint32_t bs = profile_.block_size;

  // RUNNING, in admission order.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request& r = *running_[i];
    uint32_t tokens = std::min(r.num_tokens - r.num_computed, budget);
    // No position at or beyond max_model_len is ever computed.
    tokens = std::min(tokens, r.num_computed + 1 < profile_.max_model_len
                                  ? profile_.max_model_len - 1 - r.num_computed
                                  : 0u);
    if (tokens == 0) {
      ++i;
      continue;
    }
    bool fits = false;
    while (true) {
      if (allocate_slots(r, tokens, {}, 0, false)) {
        fits = true;
        break;
      }
      Request& victim = *running_.back();
      running_.pop_back();
      preempt(victim);
      step.preempted.push_back(victim.id);
      if (&victim == &r) break;
    }
    if (!fits) break;
    step.batch.push_back({r.id, tokens, r.num_computed});
    budget -= tokens;
    ++i;
  }

  // WAITING, FCFS; not in a step that preempted.
  if (step.preempted.empty()) {
    std::vector<Request*> skipped;  // waiting for their remote KV
    while (!waiting_.empty() && budget > 0 && running_.size() < profile_.max_num_seqs) {
      Request& r = *waiting_.front();
      if (r.state == Request::State::kWaitingForRemoteKv) {
        if (!r.remote_done) {
          waiting_.pop_front();
          skipped.push_back(&r);
          continue;
        }
        finish_remote_load(r);
      }
      std::vector<uint32_t> hit;
      uint32_t hit_tokens = 0;
      uint32_t external = 0;
      uint32_t computed = r.num_computed;
      // A request holding blocks already (its remote load failed) recomputes into them.
      const bool lookup = r.num_computed == 0 && r.blocks.empty();
      if (lookup) {
        // At most (tokens - 1) tokens can hit: the last one is always computed.
        const size_t max_blocks = std::min<size_t>((r.num_tokens - 1) / bs, r.hashes.size());
        hit = pool_.longest_hit(std::span(r.hashes.data(), max_blocks));
        hit_tokens = static_cast<uint32_t>(hit.size()) * bs;
        if (r.remote_tokens > hit_tokens) external = r.remote_tokens - hit_tokens;
        computed = hit_tokens + external;
      }
      const bool load_async = external > 0;
      const uint32_t tokens = load_async ? 0 : std::min(r.num_tokens - computed, budget);
      if (!allocate_slots(r, tokens + external, hit, hit_tokens, load_async)) break;
      waiting_.pop_front();
      const EngineAdmission admission{r.id, hit_tokens, r.num_tokens};
      if (lookup && !r.looked_up) {
        r.looked_up = true;
        counters_.prefix_queries += r.num_tokens;
        counters_.prefix_hits += hit_tokens;
      }
      if (load_async) {
        r.state = Request::State::kWaitingForRemoteKv;
        r.local_hit_tokens = hit_tokens;
        r.remote_tokens = 0;  // the connector asks once (NIXL clears do_remote_prefill)
        step.load_remote.push_back(admission);
        skipped.push_back(&r);
        continue;
      }
      r.remote_tokens = 0;
      if (!r.admitted) {
        r.admitted = true;
        step.admitted.push_back(admission);
      }
      r.state = Request::State::kRunning;
      r.num_computed = computed;
      running_.push_back(&r);
      step.batch.push_back({r.id, tokens, computed});
      budget -= tokens;
    }
    waiting_.insert(waiting_.begin(), skipped.begin(), skipped.end());
  }

  for (const ScheduledChunk& c : step.batch) {
    step.shape.tokens += c.tokens;
    if (c.tokens == 1) {
      step.shape.context_tokens += uint64_t{c.computed_before} + 1;
    } else {
      step.shape.attention_pairs +=
          static_cast<double>(c.tokens) * (static_cast<double>(c.computed_before) + c.tokens / 2.0);
    }
  }
  if (!step.batch.empty()) {
    step.duration_ms = step_time_ms(profile_, step.shape);
    in_step_ = step.batch;
    stepping_ = true;
    ++counters_.steps;
  }
  return step;
}

std::vector<EngineToken> EngineScheduler::complete_step() {
  std::vector<EngineToken> out;
  if (!stepping_) return out;
  stepping_ = false;
  bool any_finished = false;
  for (const ScheduledChunk& c : in_step_) {
    auto it = requests_.find(c.id);
    if (it == requests_.end()) continue;  // cancelled during the step
    Request& r = *it->second;
    if (r.state != Request::State::kRunning) continue;
    r.num_computed = c.computed_before + c.tokens;
    if (r.num_computed < r.num_tokens) continue;  // a prefill chunk that is not the last
    const uint32_t index = r.num_tokens - r.prompt_len;
    const bool finished = index + 1 >= r.max_tokens || r.num_tokens + 1 >= profile_.max_model_len;
    out.push_back({r.id, index, finished});
    if (index == 0) counters_.prompt_tokens += r.prompt_len;
    ++counters_.generation_tokens;
    if (!finished) {
      ++r.num_tokens;
      continue;
    }
    ++counters_.finished;
    any_finished = true;
    r.state = r.hold ? Request::State::kHeld : Request::State::kWaiting;  // kWaiting: about to go
  }
  in_step_.clear();
  if (any_finished) {
    std::erase_if(running_, [](const Request* r) { return r->state != Request::State::kRunning; });
    for (const EngineToken& t : out) {
      if (!t.finished) continue;
      auto it = requests_.find(t.id);
      if (it->second->state == Request::State::kHeld) continue;
      free_blocks(*it->second);
      requests_.erase(it);
    }
  }
  return out;
}

EngineSchedulerStats EngineScheduler::stats() const {
  EngineSchedulerStats s = counters_;
  s.running = static_cast<uint32_t>(running_.size());
  s.waiting = static_cast<uint32_t>(waiting_.size());
  s.held = static_cast<uint32_t>(requests_.size() - running_.size() - waiting_.size());
  s.kv_usage = pool_.usage();
  s.free_blocks = pool_.free_blocks();
  s.cached_blocks = pool_.cached_blocks();
  s.stored_blocks = pool_.stored_total();
  s.evicted_blocks = pool_.evicted_total();
  return s;
}

}  // namespace pdr::node::sim
