#include "router/routing/session_timer.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace pdr::router::routing {
namespace {

using namespace std::chrono_literals;

class SessionTimerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    queue_.emplace(&loop_);
  }
  void TearDown() override {
    queue_.reset();
    // Closed handles finish closing on the loop's next run.
    uv_run(&loop_, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }
  TimerQueue& queue() { return *queue_; }
  uv_loop_t loop_{};
  std::optional<TimerQueue> queue_;
};

TEST_F(SessionTimerTest, FiresOnceAfterItsDelay) {
  SessionTimer timer;
  int fired = 0;
  const uint64_t start = uv_now(&loop_);
  ASSERT_TRUE(timer.start(queue(), 20ms, [&] { ++fired; }));
  EXPECT_TRUE(timer.armed());
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(fired, 1);
  EXPECT_GE(uv_now(&loop_) - start, 20u);
  EXPECT_FALSE(timer.armed());
}

TEST_F(SessionTimerTest, StopAndRestartReplaceThePendingCallback) {
  SessionTimer timer;
  int first = 0, second = 0;
  ASSERT_TRUE(timer.start(queue(), 10ms, [&] { ++first; }));
  timer.stop();
  EXPECT_FALSE(timer.armed());
  ASSERT_TRUE(timer.start(queue(), 10ms, [&] { ++first; }));
  ASSERT_TRUE(timer.start(queue(), 0ms, [&] { ++second; }));
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 1);
}

TEST_F(SessionTimerTest, NeverFiresOnceDestroyed) {
  int fired = 0;
  {
    SessionTimer timer;
    ASSERT_TRUE(timer.start(queue(), 0ms, [&] { ++fired; }));
  }
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(fired, 0);
}

TEST_F(SessionTimerTest, TheCallbackMayDestroyItsOwner) {
  // What a ProxySession does when its deadline ends it: the timer is a member of the object the
  // callback releases (ASan checks nothing is touched afterwards).
  struct Owner {
    SessionTimer timer;
    int value = 7;
  };
  auto owner = std::make_unique<Owner>();
  int seen = 0;
  ASSERT_TRUE(owner->timer.start(queue(), 0ms, [&owner, &seen] {
    seen = owner->value;
    owner.reset();
  }));
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(seen, 7);
  EXPECT_EQ(owner, nullptr);
}

TEST_F(SessionTimerTest, DeadlinesFireInOrderOfDueTimeThenOfStart) {
  std::string order;
  SessionTimer a, b, c, d, e;
  ASSERT_TRUE(a.start(queue(), 30ms, [&] { order += 'a'; }));
  ASSERT_TRUE(b.start(queue(), 10ms, [&] { order += 'b'; }));
  ASSERT_TRUE(c.start(queue(), 20ms, [&] { order += 'c'; }));
  ASSERT_TRUE(d.start(queue(), 10ms, [&] { order += 'd'; }));  // same due time as b, started later
  ASSERT_TRUE(e.start(queue(), 0ms, [&] { order += 'e'; }));
  EXPECT_EQ(queue().size(), 5u);
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(order, "ebdca");
  EXPECT_EQ(queue().size(), 0u);
}

TEST_F(SessionTimerTest, StoppingTheEarliestDeadlineDoesNotFireTheNextOneEarly) {
  // The queue's libuv timer stays armed for the stopped (earlier) deadline; when it fires it must
  // re-arm for the one left, not run it before its time.
  SessionTimer early, late;
  uint64_t fired_at = 0;
  const uint64_t start = uv_now(&loop_);
  ASSERT_TRUE(early.start(queue(), 5ms, [] { ADD_FAILURE() << "stopped"; }));
  ASSERT_TRUE(late.start(queue(), 40ms, [&] { fired_at = uv_now(&loop_); }));
  early.stop();
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_GE(fired_at - start, 40u);
}

TEST_F(SessionTimerTest, ATimerDestroyedWhileLinkedLeavesTheOthersIntact) {
  // Many sessions at once, some ended (destroyed) before their deadline: the heap keeps the others
  // in order and the destroyed ones never fire.
  std::vector<std::unique_ptr<SessionTimer>> timers;
  std::vector<int> fired;
  for (int i = 0; i < 64; ++i) {
    timers.push_back(std::make_unique<SessionTimer>());
    ASSERT_TRUE(timers.back()->start(queue(), std::chrono::milliseconds((i * 7) % 23), [&fired, i] {
      fired.push_back(i);
    }));
  }
  for (int i = 0; i < 64; i += 3) timers[i].reset();
  EXPECT_EQ(queue().size(), 64u - 22u);
  uv_run(&loop_, UV_RUN_DEFAULT);
  ASSERT_EQ(fired.size(), 64u - 22u);
  for (size_t k = 0; k < fired.size(); ++k) {
    EXPECT_NE(fired[k] % 3, 0) << fired[k];
    if (k > 0) {
      const int before = (fired[k - 1] * 7) % 23, now = (fired[k] * 7) % 23;
      EXPECT_TRUE(before < now || (before == now && fired[k - 1] < fired[k])) << k;
    }
  }
}

TEST_F(SessionTimerTest, ACallbackMayStartAndStopOtherTimers) {
  SessionTimer first, second, third;
  std::string order;
  ASSERT_TRUE(third.start(queue(), 5ms, [&] { order += '3'; }));
  ASSERT_TRUE(first.start(queue(), 0ms, [&] {
    order += '1';
    third.stop();
    ASSERT_TRUE(second.start(queue(), 0ms, [&] { order += '2'; }));
    ASSERT_TRUE(first.start(queue(), 10ms, [&] { order += '4'; }));  // restarts itself
  }));
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(order, "124");
  EXPECT_FALSE(first.armed());
}

TEST_F(SessionTimerTest, TimersOfADestroyedQueueAreUnarmedAndNeverFire) {
  // A worker's queue goes with its WorkerContext; its handle closes on the loop's next run.
  SessionTimer timer;
  int fired = 0;
  ASSERT_TRUE(timer.start(queue(), 0ms, [&] { ++fired; }));
  queue_.reset();
  EXPECT_FALSE(timer.armed());
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(fired, 0);
  timer.stop();  // harmless once unlinked
}

}  // namespace
}  // namespace pdr::router::routing
