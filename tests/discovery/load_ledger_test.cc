// The load ledger and its charges (discovery/load_ledger.h, load_charge.h): each handle gives
// back exactly what it took, once, to the cell it took it from (moves, releases in part and in
// whole, a replaced cell, ranks beyond the slots), the per-rank slots sum to the node's totals,
// counters never wrap below zero under many threads, and the rate estimates converge, resist
// outliers and report their age.
#include "discovery/load_charge.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <type_traits>
#include <vector>

namespace pdr::discovery {
namespace {

using namespace std::chrono_literals;

Instance node(uint32_t dp_size) {
  Instance i;
  i.key = "127.0.0.1:8000";
  i.dp_size = dp_size;
  return i;
}

LoadFigures rank_sum(const LoadLedger& ledger) {
  LoadFigures sum = ledger.beyond();
  for (uint32_t r = 0; r < ledger.rank_slots(); ++r) sum += ledger.rank(r);
  return sum;
}

static_assert(!std::is_copy_constructible_v<LoadCharge> && !std::is_copy_assignable_v<LoadCharge>);
static_assert(std::is_nothrow_move_constructible_v<LoadCharge> && std::is_nothrow_move_assignable_v<LoadCharge>);

TEST(LoadCharge, GivesBackEverythingItTookOnDestruction) {
  Instance n = node(4);
  {
    LoadCharge c(n, 2);
    c.queue_prefill(100);
    c.start_decode(40);
    c.add_kv_tokens(3);
    EXPECT_EQ(node_load(*n.liveness), (LoadFigures{1, 100, 1, 43}));
    EXPECT_EQ(n.liveness->ledger.rank(2), (LoadFigures{1, 100, 1, 43}));
    EXPECT_EQ(n.liveness->ledger.rank(0), LoadFigures{});
    EXPECT_EQ(n.liveness->outstanding.load(), 1u);
  }
  EXPECT_EQ(node_load(*n.liveness), LoadFigures{});
  EXPECT_EQ(rank_sum(n.liveness->ledger), LoadFigures{});
}

TEST(LoadCharge, PartialReleasesAndReleaseAreEachOnce) {
  Instance n = node(1);
  LoadCharge c(n, std::nullopt);
  c.queue_prefill(10);
  c.prefill_done();
  c.prefill_done();  // nothing left to give back
  EXPECT_EQ(node_load(*n.liveness), (LoadFigures{1, 0, 0, 0}));
  c.start_decode(5);
  c.start_decode(5);  // a second start adds KV only, never a second sequence
  EXPECT_EQ(node_load(*n.liveness), (LoadFigures{1, 0, 1, 10}));
  c.decode_done();
  c.decode_done();
  EXPECT_EQ(node_load(*n.liveness), (LoadFigures{1, 0, 0, 0}));
  c.release();
  c.release();
  c.queue_prefill(7);  // unbound: changes nothing
  EXPECT_FALSE(c.bound());
  EXPECT_EQ(node_load(*n.liveness), LoadFigures{});
}

TEST(LoadCharge, MovedFromHoldsNothing) {
  Instance n = node(2);
  LoadCharge a(n, 1);
  a.queue_prefill(8);
  LoadCharge b(std::move(a));
  EXPECT_FALSE(a.bound());  // NOLINT(bugprone-use-after-move): the contract under test
  a.release();
  EXPECT_EQ(node_load(*n.liveness), (LoadFigures{1, 8, 0, 0}));
  LoadCharge c;
  c = std::move(b);
  EXPECT_EQ(node_load(*n.liveness), (LoadFigures{1, 8, 0, 0}));
  // Assigning over a charge gives back what it held first (a decode retried on another node).
  c = LoadCharge(n, 0);
  EXPECT_EQ(node_load(*n.liveness), (LoadFigures{1, 0, 0, 0}));
  EXPECT_EQ(n.liveness->ledger.rank(0).requests, 1u);
  EXPECT_EQ(n.liveness->ledger.rank(1), LoadFigures{});
  c = LoadCharge();
  EXPECT_EQ(node_load(*n.liveness), LoadFigures{});
}

TEST(LoadCharge, TokenOnlyChargeHoldsNoRequest) {
  Instance n = node(1);
  LoadCharge c(n, 0, /*request=*/false);
  c.queue_prefill(30);
  EXPECT_EQ(node_load(*n.liveness), (LoadFigures{0, 30, 0, 0}));
  c.release();
  EXPECT_EQ(node_load(*n.liveness), LoadFigures{});
}

TEST(LoadCharge, MovesBetweenRanksWithoutChangingTheTotals) {
  Instance n = node(4);
  LoadCharge c(n, 0);
  c.queue_prefill(12);
  c.move_to_rank(3);
  EXPECT_EQ(n.liveness->ledger.rank(0), LoadFigures{});
  EXPECT_EQ(n.liveness->ledger.rank(3), (LoadFigures{1, 12, 0, 0}));
  EXPECT_EQ(node_load(*n.liveness), (LoadFigures{1, 12, 0, 0}));
  c.release();
  EXPECT_EQ(rank_sum(n.liveness->ledger), LoadFigures{});
}

TEST(LoadCharge, RanksBeyondTheSlotsShareOneSlotAndStillSumToTheTotals) {
  Instance n = node(1000);  // over kMaxLedgerRanks
  LoadCharge low(n, 5), high(n, 900), higher(n, 999);
  high.queue_prefill(4);
  EXPECT_EQ(n.liveness->ledger.rank_slots(), kMaxLedgerRanks);
  EXPECT_EQ(n.liveness->ledger.beyond(), (LoadFigures{2, 4, 0, 0}));
  EXPECT_EQ(rank_sum(n.liveness->ledger), node_load(*n.liveness));
  high.move_to_rank(kMaxLedgerRanks + 1);  // beyond to beyond
  EXPECT_EQ(rank_sum(n.liveness->ledger), node_load(*n.liveness));
  high.move_to_rank(1);
  EXPECT_EQ(n.liveness->ledger.beyond(), (LoadFigures{1, 0, 0, 0}));
  EXPECT_EQ(rank_sum(n.liveness->ledger), node_load(*n.liveness));
}

// A dp_size that grew after the slots were made (the same cell, re-registered): the new ranks
// are counted beyond the slots, never lost.
TEST(LoadCharge, ADpSizeThatGrewCountsBeyondTheSlots) {
  Instance n = node(2);
  LoadCharge a(n, 1);
  n.dp_size = 8;
  LoadCharge b(n, 6);
  EXPECT_EQ(n.liveness->ledger.rank_slots(), 2u);
  EXPECT_EQ(n.liveness->ledger.beyond().requests, 1u);
  EXPECT_EQ(rank_sum(n.liveness->ledger), node_load(*n.liveness));
}

// The node restarts or is removed and learnt again: its Instance gets a new cell. Charges on the
// old cell give back to the old one (which then reads zero), the new one starts and ends at zero.
TEST(LoadCharge, ACellReplacedWhileChargesAreHeld) {
  Instance n = node(2);
  std::shared_ptr<InstanceLiveness> old_cell = n.liveness;
  LoadCharge old_charge(n, 1);
  old_charge.queue_prefill(50);
  n.liveness = std::make_shared<InstanceLiveness>();  // the registry's fresh entry
  LoadCharge new_charge(n, 0);
  EXPECT_EQ(node_load(*n.liveness), (LoadFigures{1, 0, 0, 0}));
  EXPECT_EQ(node_load(*old_cell), (LoadFigures{1, 50, 0, 0}));
  // The old cell lives as long as a charge on it, even when nothing else holds it.
  std::weak_ptr<InstanceLiveness> weak = old_cell;
  old_cell.reset();
  EXPECT_FALSE(weak.expired());
  old_charge.release();
  EXPECT_TRUE(weak.expired());
  new_charge.release();
  EXPECT_EQ(node_load(*n.liveness), LoadFigures{});
}

// Many threads charge and give back on the same node while a reader watches: no counter ever
// reads as wrapped below zero, and all end at zero with the ranks summing to the totals.
TEST(LoadCharge, ManyThreadsNeverDriveACounterBelowZero) {
  Instance n = node(8);
  constexpr int kThreads = 4, kRounds = 20000;
  std::atomic<bool> done{false};
  std::atomic<uint64_t> wrapped{0};
  std::thread reader([&] {
    while (!done.load()) {
      const LoadFigures f = node_load(*n.liveness);
      if (f.requests > kThreads || f.decode_sequences > kThreads || f.queued_prefill_tokens > 1u << 30 ||
          f.kv_tokens > 1u << 30) {
        wrapped.fetch_add(1);
      }
      for (uint32_t r = 0; r < n.liveness->ledger.rank_slots(); ++r) {
        if (n.liveness->ledger.rank(r).requests > kThreads) wrapped.fetch_add(1);
      }
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        LoadCharge c(n, static_cast<uint32_t>((t + i) % 8));
        c.queue_prefill(static_cast<uint64_t>(i % 100 + 1));
        if (i % 3 == 0) c.move_to_rank(static_cast<uint32_t>(i % 8));
        c.prefill_done();
        c.start_decode(10);
        c.add_kv_tokens(1);
        LoadCharge moved = std::move(c);
        if (i % 2 == 0) moved.decode_done();
      }
    });
  }
  for (auto& w : workers) w.join();
  done = true;
  reader.join();
  EXPECT_EQ(wrapped.load(), 0u);
  EXPECT_EQ(node_load(*n.liveness), LoadFigures{});
  EXPECT_EQ(rank_sum(n.liveness->ledger), LoadFigures{});
}

TEST(RateEstimate, NoEstimateBeforeTheFirstSample) {
  RateEstimate e;
  const auto r = e.read(std::chrono::steady_clock::now());
  EXPECT_FALSE(r.present());
  EXPECT_EQ(r.value, 0);
  e.add(0, std::chrono::steady_clock::now());   // ignored
  e.add(-3, std::chrono::steady_clock::now());  // ignored
  e.add(std::numeric_limits<double>::quiet_NaN(), std::chrono::steady_clock::now());
  EXPECT_FALSE(e.read(std::chrono::steady_clock::now()).present());
}

TEST(RateEstimate, ConvergesToASteadyRate) {
  RateEstimate e;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 60; ++i) e.add(1000.0 + (i % 2 == 0 ? 50 : -50), t0);
  const auto r = e.read(t0);
  EXPECT_EQ(r.samples, 60u);
  EXPECT_NEAR(r.value, 1000.0, 60.0);
}

TEST(RateEstimate, AnOutlierMovesItLittleAndARealChangeGetsThere) {
  RateEstimate e;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) e.add(100.0, t0);
  e.add(1e9, t0);  // one stray sample (a leg timed across a stall, a clock hiccup)
  EXPECT_LE(e.read(t0).value, 100.0 * (1 + RateEstimate::kAlpha * (RateEstimate::kClamp - 1)) + 1e-9);
  e.add(1e-6, t0);
  EXPECT_GE(e.read(t0).value, 50.0);
  for (int i = 0; i < 60; ++i) e.add(1000.0, t0);  // the node really got ten times faster
  EXPECT_NEAR(e.read(t0).value, 1000.0, 10.0);
}

TEST(RateEstimate, ReportsItsAge) {
  RateEstimate e;
  const auto t0 = std::chrono::steady_clock::now();
  e.add(5.0, t0);
  EXPECT_EQ(e.read(t0).age, std::chrono::steady_clock::duration::zero());
  EXPECT_EQ(e.read(t0 + 3s).age, std::chrono::steady_clock::duration(3s));
  EXPECT_EQ(e.read(t0 - 1s).age, std::chrono::steady_clock::duration::zero());  // never negative
}

TEST(RateEstimate, StaysBounded) {
  RateEstimate e;
  const auto t0 = std::chrono::steady_clock::now();
  e.add(1e300, t0);
  EXPECT_LE(e.read(t0).value, RateEstimate::kMax);
  RateEstimate f;
  f.add(1e-300, t0);
  EXPECT_GE(f.read(t0).value, RateEstimate::kMin);
}

TEST(RateEstimate, ConcurrentSamplesAllCount) {
  RateEstimate e;
  constexpr int kThreads = 4, kSamples = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kSamples; ++i) e.add(42.0, std::chrono::steady_clock::now());
    });
  }
  for (auto& t : threads) t.join();
  const auto r = e.read(std::chrono::steady_clock::now());
  EXPECT_EQ(r.samples, uint64_t{kThreads} * kSamples);
  EXPECT_NEAR(r.value, 42.0, 1e-9);
}

// The prefill busy clock measures the node's service rate, not a leg's latency.
TEST(PrefillBusyClock, LegsWaitingBehindOthersDoNotMakeTheNodeLookSlow) {
  LoadLedger ledger;
  const auto t0 = std::chrono::steady_clock::now();
  // Two legs sent at once; the node computes 1,000 tokens a second, one leg after the other.
  ledger.prefill_leg_started(t0);
  ledger.prefill_leg_started(t0);
  ledger.prefill_leg_ended(1000, t0 + 1s);
  EXPECT_FALSE(ledger.prefill_tokens_per_second.read(t0 + 1s).present());  // still busy
  ledger.prefill_leg_ended(1000, t0 + 2s);
  // 2,000 tokens in 2 s of busy time: 1,000/s (per-leg latency said 1,000 and 500).
  const auto r = ledger.prefill_tokens_per_second.read(t0 + 2s);
  EXPECT_EQ(r.samples, 1u);
  EXPECT_NEAR(r.value, 1000, 1e-6);
  // Idle time between legs is not busy time.
  ledger.prefill_leg_started(t0 + 10s);
  ledger.prefill_leg_ended(500, t0 + 10500ms);
  EXPECT_NEAR(ledger.prefill_tokens_per_second.read(t0 + 11s).value, 1000, 1e-6);
  EXPECT_EQ(ledger.prefill_tokens_per_second.read(t0 + 11s).samples, 2u);
}

TEST(PrefillBusyClock, GivenUpLegsAddTimeButNoTokensAndAWindowClosesUnderEndlessLoad) {
  LoadLedger ledger;
  const auto t0 = std::chrono::steady_clock::now();
  // A leg given up alone teaches nothing.
  ledger.prefill_leg_started(t0);
  ledger.prefill_leg_ended(0, t0 + 1s);
  EXPECT_FALSE(ledger.prefill_tokens_per_second.read(t0 + 1s).present());
  // Never idle: a sample once a window of tokens was answered.
  auto t = t0 + 2s;
  ledger.prefill_leg_started(t);
  uint64_t answered = 0;
  while (answered < LoadLedger::kRateWindowTokens) {
    ledger.prefill_leg_started(t);  // the next leg is queued before this one is answered
    t += 1s;
    ledger.prefill_leg_ended(8192, t);
    answered += 8192;
  }
  const auto r = ledger.prefill_tokens_per_second.read(t);
  EXPECT_EQ(r.samples, 1u);
  EXPECT_NEAR(r.value, 8192, 1e-6);
  // A leg ended that never started through the clock changes nothing.
  LoadLedger other;
  other.prefill_leg_ended(1000, t0);
  EXPECT_FALSE(other.prefill_tokens_per_second.read(t0).present());
}

TEST(PrefillBusyClock, ChargesStartAndEndLegs) {
  Instance n = node(1);
  n.liveness = std::make_shared<InstanceLiveness>();
  {
    LoadCharge answered(n, std::nullopt);
    answered.queue_prefill(4000);
    answered.prefill_done();  // counted as answered
    LoadCharge abandoned(n, std::nullopt);
    abandoned.queue_prefill(4000);
  }  // released with tokens queued: given up
  const auto r = n.liveness->ledger.prefill_tokens_per_second.read(std::chrono::steady_clock::now());
  EXPECT_EQ(r.samples, 1u);  // from the answered leg only
  EXPECT_GT(r.value, 0);
}

}  // namespace
}  // namespace pdr::discovery
