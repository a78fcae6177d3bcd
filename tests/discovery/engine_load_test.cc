// The scraped engine load kept in a node's liveness cell (discovery/engine_load.h): figures are
// present only while fresh (stale_after from their read), per DP rank when the page had engine
// labels, failures keep the figures until they age out, the merge with the ledger adds only the
// engine's requests that were not pdrouter's own, and readers on other threads never see a mix
// of two stores.
#include "discovery/engine_load.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "discovery/instance.h"
#include "discovery/load_charge.h"

namespace pdr::discovery {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

proto::EngineLoadPage page(proto::EngineLoadFigures node, std::vector<proto::EngineLoadFigures> ranks = {}) {
  proto::EngineLoadPage p;
  p.outcome = proto::EngineLoadPage::Outcome::kOk;
  p.node = node;
  p.ranks = std::move(ranks);
  return p;
}

Instance node(uint32_t dp_size = 1) {
  Instance i;
  i.key = "127.0.0.1:8000";
  i.dp_size = dp_size;
  return i;
}

TEST(EngineLoad, AbsentUntilStored) {
  const Instance n = node();
  EXPECT_FALSE(engine_load(n, Clock::now()).present);
  EXPECT_FALSE(engine_rank_load(n, 0, Clock::now()).present);
  EXPECT_EQ(n.liveness->engine_load.state().reads, 0u);
}

TEST(EngineLoad, FreshUntilStaleAfterThenAbsent) {
  const Instance n = node();
  const Clock::time_point t0 = Clock::now();
  n.liveness->engine_load.store(page({3, 4, 0.5}), 1, n.liveness->ledger, t0, 3000ms);
  const EngineLoad fresh = engine_load(n, t0 + 3000ms);
  ASSERT_TRUE(fresh.present);
  EXPECT_EQ(fresh.figures, (proto::EngineLoadFigures{3, 4, 0.5}));
  EXPECT_EQ(fresh.own_requests_at_read, 1u);
  EXPECT_EQ(fresh.age, 3000ms);
  const EngineLoad stale = engine_load(n, t0 + 3001ms);
  EXPECT_FALSE(stale.present);
  EXPECT_EQ(stale.figures, proto::EngineLoadFigures{});
  EXPECT_EQ(stale.age, 3001ms);
}

TEST(EngineLoad, FailureKeepsFiguresUntilTheyAgeOut) {
  const Instance n = node();
  const Clock::time_point t0 = Clock::now();
  EngineLoadCell& cell = n.liveness->engine_load;
  cell.store(page({1, 2, 0.1}), 0, n.liveness->ledger, t0, 1000ms);
  cell.fail(EngineScrapeFailure::kTimeout, t0 + 500ms);
  EXPECT_TRUE(engine_load(n, t0 + 900ms).present);
  EXPECT_FALSE(engine_load(n, t0 + 1001ms).present);
  const EngineScrapeState s = cell.state();
  EXPECT_EQ(s.last_failure, EngineScrapeFailure::kTimeout);
  EXPECT_EQ(s.last_failure_at, t0 + 500ms);
  EXPECT_EQ(s.reads, 1u);
  EXPECT_EQ(s.failures, 1u);
  cell.store(page({1, 2, 0.1}), 0, n.liveness->ledger, t0 + 2000ms, 1000ms);
  EXPECT_EQ(cell.state().last_failure, EngineScrapeFailure::kNone);
  EXPECT_TRUE(engine_load(n, t0 + 2500ms).present);
}

TEST(EngineLoad, PerRankFiguresAndOwnRequestsFromTheRankLedger) {
  const Instance n = node(2);
  LoadCharge a(n, 1), b(n, 1);
  const Clock::time_point t0 = Clock::now();
  n.liveness->engine_load.store(page({8, 7, 0.5}, {{3, 0, 0.25}, {5, 7, 0.75}}), 2, n.liveness->ledger, t0, 1s);
  const EngineLoad whole = engine_load(n, t0);
  ASSERT_TRUE(whole.present);
  EXPECT_EQ(whole.ranks, 2u);
  const EngineLoad r1 = engine_rank_load(n, 1, t0);
  ASSERT_TRUE(r1.present);
  EXPECT_EQ(r1.figures, (proto::EngineLoadFigures{5, 7, 0.75}));
  EXPECT_EQ(r1.own_requests_at_read, 2u);
  EXPECT_EQ(engine_rank_load(n, 0, t0).own_requests_at_read, 0u);
  EXPECT_FALSE(engine_rank_load(n, 2, t0).present);
  // A later page without engine labels: no rank is present any more.
  n.liveness->engine_load.store(page({8, 7, 0.5}), 2, n.liveness->ledger, t0 + 1ms, 1s);
  EXPECT_FALSE(engine_rank_load(n, 1, t0 + 1ms).present);
  EXPECT_TRUE(engine_load(n, t0 + 1ms).present);
}

TEST(EngineLoad, MergeAddsOnlyOtherClientsRequests) {
  LoadFigures ledger;
  ledger.requests = 4;
  ledger.queued_prefill_tokens = 900;
  EngineLoad engine;
  engine.present = true;
  engine.figures = {6, 3, 0.4};
  engine.own_requests_at_read = 5;  // of the engine's 9, 5 were pdrouter's
  const MergedLoad m = merge_load(ledger, engine);
  EXPECT_TRUE(m.engine);
  EXPECT_EQ(m.other_requests, 4u);
  EXPECT_EQ(m.requests, 8u);  // 4 of pdrouter's now + 4 of other clients'
  EXPECT_EQ(m.engine_waiting, 3u);
  EXPECT_DOUBLE_EQ(m.kv_cache_usage, 0.4);
  EXPECT_EQ(m.ledger, ledger);
}

TEST(EngineLoad, MergeNeverCountsBelowTheLedger) {
  LoadFigures ledger;
  ledger.requests = 10;
  EngineLoad engine;
  engine.present = true;
  engine.figures = {2, 0, -1};
  engine.own_requests_at_read = 10;  // the engine had not seen all of pdrouter's yet
  const MergedLoad m = merge_load(ledger, engine);
  EXPECT_EQ(m.other_requests, 0u);
  EXPECT_EQ(m.requests, 10u);
  EXPECT_LT(m.kv_cache_usage, 0);
}

TEST(EngineLoad, MergeWithoutFreshFiguresIsTheLedger) {
  LoadFigures ledger;
  ledger.requests = 2;
  ledger.decode_sequences = 1;
  EngineLoad stale;
  stale.figures = {50, 50, 0.9};  // present=false: not to be read
  const MergedLoad m = merge_load(ledger, stale);
  EXPECT_FALSE(m.engine);
  EXPECT_EQ(m.requests, 2u);
  EXPECT_EQ(m.other_requests, 0u);
  EXPECT_EQ(m.engine_waiting, 0u);
  EXPECT_LT(m.kv_cache_usage, 0);
  EXPECT_EQ(m.ledger, ledger);
}

TEST(EngineLoad, FailureNames) {
  EXPECT_EQ(to_string(EngineScrapeFailure::kTooLarge), "too_large");
  EXPECT_EQ(to_string(EngineScrapeFailure::kMissingFamilies), "missing_families");
  EXPECT_EQ(to_string(EngineScrapeFailure::kConnect), "connect");
}

// One writer storing pages whose figures are all equal (k, k, k/1e6) while readers check they
// never see two stores mixed.
TEST(EngineLoad, ReadersNeverSeeAMixOfTwoStores) {
  const Instance n = node(2);
  std::atomic<bool> stop{false};
  const Clock::time_point t0 = Clock::now();
  std::thread writer([&] {
    for (uint32_t k = 1; k < 20000; ++k) {
      const proto::EngineLoadFigures f{k, k, k / 1e6};
      n.liveness->engine_load.store(page(f, {f, f}), k, n.liveness->ledger, t0, 1h);
    }
    stop = true;
  });
  uint64_t torn = 0, seen = 0;
  while (!stop.load()) {
    for (uint32_t r : {0u, 1u}) {
      const EngineLoad l = r == 0 ? engine_load(n, t0) : engine_rank_load(n, r, t0);
      if (!l.present) continue;
      ++seen;
      const uint32_t k = l.figures.running;
      if (l.figures.waiting != k || l.figures.kv_cache_usage != k / 1e6 || (r == 0 && l.own_requests_at_read != k)) {
        ++torn;
      }
    }
  }
  writer.join();
  EXPECT_EQ(torn, 0u);
  EXPECT_GT(seen, 0u);
}

}  // namespace
}  // namespace pdr::discovery
