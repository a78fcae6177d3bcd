#include "router/routing/slo_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

namespace pdr::router::routing {
namespace {

TEST(SloGate, WakeRunsEveryParkedRecheckOnceOnItsWorker) {
  SloGate gate;
  std::vector<std::pair<uint32_t, int>> posted;
  gate.set_post([&](uint32_t worker, std::function<void()> fn) {
    fn();
    posted.emplace_back(worker, 0);
  });
  int runs = 0;
  gate.wake();  // nobody parked: nothing
  EXPECT_EQ(gate.rechecks(), 0u);
  gate.park(3, [&] { ++runs; });
  gate.park(1, [&] { ++runs; });
  EXPECT_EQ(gate.parked(), 2u);
  gate.wake();
  EXPECT_EQ(runs, 2);
  ASSERT_EQ(posted.size(), 2u);
  EXPECT_EQ(posted[0].first, 3u);
  EXPECT_EQ(posted[1].first, 1u);
  EXPECT_EQ(gate.parked(), 0u);
  gate.wake();  // each once
  EXPECT_EQ(runs, 2);
}

TEST(SloGate, WithdrawDropsTheRecheckAndWhatItHolds) {
  SloGate gate;
  auto held = std::make_shared<int>(7);
  std::weak_ptr<int> watch = held;
  int runs = 0;
  const uint64_t a = gate.park(0, [held = std::move(held), &runs] { ++runs; });
  const uint64_t b = gate.park(0, [&runs] { ++runs; });
  EXPECT_TRUE(gate.withdraw(a));
  EXPECT_TRUE(watch.expired());
  EXPECT_FALSE(gate.withdraw(a));
  gate.wake();
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(gate.withdraw(b));  // woken already
}

TEST(SloGate, DropAllReleasesEveryWaiter) {
  SloGate gate;
  auto held = std::make_shared<int>(1);
  std::weak_ptr<int> watch = held;
  gate.park(0, [held = std::move(held)] {});
  gate.drop_all();
  EXPECT_TRUE(watch.expired());
  EXPECT_EQ(gate.parked(), 0u);
}

TEST(SloGate, ConcurrentParksAndWakesLoseNothing) {
  SloGate gate;
  std::atomic<int> runs{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        gate.park(static_cast<uint32_t>(t), [&] { runs.fetch_add(1); });
        if (i % 3 == 0) gate.wake();
      }
    });
  }
  for (auto& th : threads) th.join();
  gate.wake();
  EXPECT_EQ(runs.load(), 8000);
}

}  // namespace
}  // namespace pdr::router::routing
