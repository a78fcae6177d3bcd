#include "discovery/engine_load.h"

#include <algorithm>
#include <bit>

#include "discovery/instance.h"

namespace pdr::discovery {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;
// The sequence counter's figures: stored with release, loaded with acquire (see store()).
constexpr auto kPublish = std::memory_order_release;
constexpr auto kObserve = std::memory_order_acquire;

int64_t ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

void put(std::atomic<uint32_t>& running, std::atomic<uint32_t>& waiting, std::atomic<uint64_t>& kv_bits,
         const proto::EngineLoadFigures& f) {
  running.store(f.running, kPublish);
  waiting.store(f.waiting, kPublish);
  kv_bits.store(std::bit_cast<uint64_t>(f.kv_cache_usage), kPublish);
}

}  // namespace

std::string_view to_string(EngineScrapeFailure why) {
  switch (why) {
    case EngineScrapeFailure::kNone: return "none";
    case EngineScrapeFailure::kConnect: return "connect";
    case EngineScrapeFailure::kTimeout: return "timeout";
    case EngineScrapeFailure::kStatus: return "status";
    case EngineScrapeFailure::kTooLarge: return "too_large";
    case EngineScrapeFailure::kMalformed: return "malformed";
    case EngineScrapeFailure::kMissingFamilies: return "missing_families";
    case EngineScrapeFailure::kCount: break;
  }
  return "none";
}

MergedLoad merge_load(const LoadFigures& ledger, const EngineLoad& engine) {
  MergedLoad out;
  out.ledger = ledger;
  out.requests = ledger.requests;
  if (!engine.present) return out;
  out.engine = true;
  const uint64_t engine_requests = uint64_t{engine.figures.running} + engine.figures.waiting;
  out.other_requests = engine_requests > engine.own_requests_at_read
                           ? static_cast<uint32_t>(std::min<uint64_t>(engine_requests - engine.own_requests_at_read,
                                                                      UINT32_MAX - ledger.requests))
                           : 0;
  out.requests = ledger.requests + out.other_requests;
  out.engine_waiting = engine.figures.waiting;
  out.kv_cache_usage = engine.figures.kv_cache_usage;
  return out;
}

EngineLoadCell::~EngineLoadCell() { delete ranks_.load(kRelaxed); }

void EngineLoadCell::store(const proto::EngineLoadPage& page, uint32_t own_requests, const LoadLedger& ledger,
                           Clock::time_point read_at, Clock::duration stale_after) {
  Ranks* ranks = ranks_.load(std::memory_order_acquire);
  if (ranks == nullptr && !page.ranks.empty()) {
    // Made once and kept for the cell's life (readers hold no reference to count): sized by the
    // first page with engine labels; a later page with more ranks keeps the rest node-only.
    ranks = new Ranks;
    ranks->count = std::min<uint32_t>(static_cast<uint32_t>(page.ranks.size()), kMaxEngineLoadRanks);
    ranks->slots = std::make_unique<Slot[]>(ranks->count);
    ranks_.store(ranks, std::memory_order_release);
  }
  // Sequence: odd while the figures change. Each figure is a release store, so a reader whose
  // acquire load sees a new figure also sees the odd count (or a later one) and retries; the
  // final release store orders the figures before the even count. (Release/acquire on the
  // figures rather than fences: ThreadSanitizer does not model atomic_thread_fence.)
  const uint64_t seq = seq_.load(kRelaxed);
  seq_.store(seq + 1, kRelaxed);
  put(node_.running, node_.waiting, node_.kv_bits, page.node);
  node_.own.store(own_requests, kPublish);
  const uint32_t stored = ranks == nullptr ? 0 : std::min<uint32_t>(ranks->count, page.ranks.size());
  for (uint32_t i = 0; i < stored; ++i) {
    put(ranks->slots[i].running, ranks->slots[i].waiting, ranks->slots[i].kv_bits, page.ranks[i]);
    ranks->slots[i].own.store(ledger.rank(i).requests, kPublish);
  }
  page_ranks_.store(static_cast<uint32_t>(page.ranks.size()), kPublish);
  read_at_ns_.store(ns(read_at), kPublish);
  fresh_until_ns_.store(std::max<int64_t>(1, ns(read_at + stale_after)), kPublish);
  seq_.store(seq + 2, std::memory_order_release);
  reads_.fetch_add(1, kRelaxed);
  last_failure_.store(static_cast<uint8_t>(EngineScrapeFailure::kNone), kRelaxed);
}

void EngineLoadCell::fail(EngineScrapeFailure why, Clock::time_point at) {
  // The figures stay: they age out by themselves once stale_after has passed since their read.
  failures_.fetch_add(1, kRelaxed);
  last_failure_.store(static_cast<uint8_t>(why), kRelaxed);
  last_failure_ns_.store(ns(at), kRelaxed);
}

EngineLoad EngineLoadCell::read(const Slot& slot, uint32_t rank_limit, Clock::time_point now) const {
  EngineLoad out;
  for (int attempt = 0; attempt < 64; ++attempt) {
    const uint64_t before = seq_.load(std::memory_order_acquire);
    if (before % 2 == 1) continue;
    const int64_t fresh_until = fresh_until_ns_.load(kObserve);
    const int64_t read_at = read_at_ns_.load(kObserve);
    const uint32_t page_ranks = page_ranks_.load(kObserve);
    out.figures.running = slot.running.load(kObserve);
    out.figures.waiting = slot.waiting.load(kObserve);
    out.figures.kv_cache_usage = std::bit_cast<double>(slot.kv_bits.load(kObserve));
    out.own_requests_at_read = slot.own.load(kObserve);
    if (seq_.load(kRelaxed) != before) continue;
    const int64_t now_ns = ns(now);
    out.present = fresh_until != 0 && now_ns <= fresh_until && rank_limit < std::max<uint32_t>(page_ranks, 1);
    out.age = std::chrono::nanoseconds(std::max<int64_t>(0, now_ns - read_at));
    out.ranks = page_ranks;
    if (!out.present) out = EngineLoad{.present = false, .age = out.age, .ranks = page_ranks};
    return out;
  }
  return EngineLoad{};  // a store kept overlapping: treat as absent this once
}

EngineLoad EngineLoadCell::node(Clock::time_point now) const { return read(node_, 0, now); }

EngineLoad EngineLoadCell::rank(uint32_t rank, Clock::time_point now) const {
  const Ranks* ranks = ranks_.load(std::memory_order_acquire);
  if (ranks == nullptr || rank >= ranks->count) return EngineLoad{};
  EngineLoad out = read(ranks->slots[rank], rank, now);
  if (out.ranks == 0) out.present = false;  // the newest page had no engine labels
  return out;
}

EngineScrapeState EngineLoadCell::state() const {
  EngineScrapeState s;
  s.last_failure = static_cast<EngineScrapeFailure>(last_failure_.load(kRelaxed));
  const int64_t at = last_failure_ns_.load(kRelaxed);
  if (at != 0) s.last_failure_at = Clock::time_point(std::chrono::nanoseconds(at));
  s.reads = reads_.load(kRelaxed);
  s.failures = failures_.load(kRelaxed);
  return s;
}

EngineLoad engine_load(const Instance& node, std::chrono::steady_clock::time_point now) {
  return node.liveness->engine_load.node(now);
}

EngineLoad engine_rank_load(const Instance& node, uint32_t rank, std::chrono::steady_clock::time_point now) {
  return node.liveness->engine_load.rank(rank, now);
}

}  // namespace pdr::discovery
