// The load ledger's storage and rate estimates (contracts in load_ledger.h).
#include "discovery/load_ledger.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace pdr::discovery {

LoadFigures LoadCounters::read() const {
  return {requests.load(std::memory_order_relaxed), queued_prefill_tokens.load(std::memory_order_relaxed),
          decode_sequences.load(std::memory_order_relaxed), kv_tokens.load(std::memory_order_relaxed)};
}

void RateEstimate::add(double sample, std::chrono::steady_clock::time_point now) {
  if (!std::isfinite(sample) || sample <= 0) return;
  // The average and the count are separate atomics: a reader may see a count one ahead of the
  // value, which only matters for the first sample (value 0 with samples 1 reads as "just in").
  uint64_t old_bits = bits_.load(std::memory_order_relaxed);
  for (;;) {
    const double old_value = std::bit_cast<double>(old_bits);
    double next;
    if (old_value <= 0) {
      next = sample;  // the first sample is the estimate
    } else {
      double s = sample;
      if (samples_.load(std::memory_order_relaxed) >= kWarmup) {
        s = std::clamp(s, old_value / kClamp, old_value * kClamp);
      }
      next = old_value + kAlpha * (s - old_value);
    }
    next = std::clamp(next, kMin, kMax);
    if (bits_.compare_exchange_weak(old_bits, std::bit_cast<uint64_t>(next), std::memory_order_relaxed)) break;
  }
  samples_.fetch_add(1, std::memory_order_relaxed);
  last_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
                 std::memory_order_relaxed);
}

RateEstimate::Reading RateEstimate::read(std::chrono::steady_clock::time_point now) const {
  Reading r;
  r.samples = samples_.load(std::memory_order_relaxed);
  if (r.samples == 0) return r;
  r.value = std::bit_cast<double>(bits_.load(std::memory_order_relaxed));
  const auto last = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(last_ns_.load(std::memory_order_relaxed)));
  r.age = std::max(now - last, std::chrono::steady_clock::duration::zero());
  return r;
}

LoadLedger::~LoadLedger() { delete ranks_.load(std::memory_order_acquire); }

void LoadLedger::prefill_leg_started(std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(prefill_clock_mu_);
  if (prefill_legs_++ == 0) busy_mark_ = now;  // idle until now: not busy time
}

void LoadLedger::prefill_leg_ended(uint64_t answered_tokens, std::chrono::steady_clock::time_point now) {
  double sample = 0;
  {
    std::lock_guard<std::mutex> lock(prefill_clock_mu_);
    if (prefill_legs_ == 0) return;  // not started through the clock
    if (now > busy_mark_) busy_seconds_ += std::chrono::duration<double>(now - busy_mark_).count();
    busy_mark_ = std::max(busy_mark_, now);
    answered_tokens_ += answered_tokens;
    const bool idle = --prefill_legs_ == 0;
    if ((idle && answered_tokens_ >= kMinRateTokens) || answered_tokens_ >= kRateWindowTokens) {
      if (busy_seconds_ > 0) sample = static_cast<double>(answered_tokens_) / busy_seconds_;
      busy_seconds_ = 0;
      answered_tokens_ = 0;
    } else if (idle && answered_tokens_ == 0) {
      busy_seconds_ = 0;  // only given-up legs: nothing to measure the time against
    }
  }
  if (sample > 0) prefill_tokens_per_second.add(sample, now);
}

uint32_t LoadLedger::rank_slots() const {
  const Ranks* r = ranks_.load(std::memory_order_acquire);
  return r == nullptr ? 0 : r->count;
}

LoadFigures LoadLedger::rank(uint32_t i) const {
  const Ranks* r = ranks_.load(std::memory_order_acquire);
  return r == nullptr || i >= r->count ? LoadFigures{} : r->slots[i].read();
}

LoadFigures LoadLedger::beyond() const {
  const Ranks* r = ranks_.load(std::memory_order_acquire);
  return r == nullptr ? LoadFigures{} : r->slots[r->count].read();
}

LoadCounters* LoadLedger::slot(uint32_t dp_size, uint32_t rank) {
  Ranks* r = ranks_.load(std::memory_order_acquire);
  if (r == nullptr) {
    // Once per cell: whoever installs first wins, a loser frees its copy.
    auto made = std::make_unique<Ranks>();
    made->count = std::clamp<uint32_t>(dp_size, 1, kMaxLedgerRanks);
    made->slots = std::make_unique<LoadCounters[]>(made->count + 1);
    Ranks* expected = nullptr;
    if (ranks_.compare_exchange_strong(expected, made.get(), std::memory_order_acq_rel, std::memory_order_acquire)) {
      r = made.release();
    } else {
      r = expected;
    }
  }
  return &r->slots[std::min(rank, r->count)];
}

}  // namespace pdr::discovery
