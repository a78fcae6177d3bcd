// LoopThread (discovery/sources/loop_thread.h): the thread and libuv loop of the discovery
// sources. Start, post, timers, a stop that finds the loop busy or lets the source finish later,
// and stop called twice.
#include "discovery/sources/loop_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/time_scale.h"

namespace pdr::discovery::sources {
namespace {

using namespace std::chrono_literals;

template <typename T>
bool ready(std::future<T>& f) {
  return f.wait_for(test::scaled(5s)) == std::future_status::ready;
}

TEST(LoopThreadTest, StartRunsFirstOnItsThreadThenTheLoop) {
  LoopThread loop("test");
  std::promise<std::thread::id> first_thread;
  auto first_id = first_thread.get_future();
  ASSERT_TRUE(loop.start([&] { first_thread.set_value(std::this_thread::get_id()); }).is_ok());
  ASSERT_TRUE(ready(first_id));
  const std::thread::id loop_id = first_id.get();
  EXPECT_NE(loop_id, std::this_thread::get_id());

  std::promise<std::thread::id> posted_thread;
  auto posted_id = posted_thread.get_future();
  ASSERT_TRUE(loop.post([&] { posted_thread.set_value(std::this_thread::get_id()); }));
  ASSERT_TRUE(ready(posted_id));
  EXPECT_EQ(posted_id.get(), loop_id);
  loop.stop();
  EXPECT_FALSE(loop.start({}).is_ok());  // runs once
}

TEST(LoopThreadTest, PostedFunctionsRunInOrderFromAnyThread) {
  LoopThread loop("test");
  ASSERT_TRUE(loop.start({}).is_ok());
  std::vector<int> seen;  // loop thread only
  constexpr int kCount = 1000;
  std::promise<void> done;
  auto done_future = done.get_future();
  std::thread poster([&] {
    for (int i = 0; i < kCount; ++i) {
      ASSERT_TRUE(loop.post([&seen, i] { seen.push_back(i); }));
    }
    ASSERT_TRUE(loop.post([&] { done.set_value(); }));
  });
  poster.join();
  ASSERT_TRUE(ready(done_future));
  loop.stop();
  ASSERT_EQ(seen.size(), static_cast<size_t>(kCount));
  for (int i = 0; i < kCount; ++i) EXPECT_EQ(seen[i], i);
}

TEST(LoopThreadTest, TimersFireOnceOrRepeatAndStop) {
  LoopThread loop("test");
  int once = 0;
  int repeats = 0;
  std::promise<void> done;
  auto done_future = done.get_future();
  LoopThread::Timer* repeating = nullptr;
  ASSERT_TRUE(loop.start([&] {
                    loop.timer("once", [&] { ++once; }).start(1ms);
                    repeating = &loop.timer("repeat", [&] {
                      if (++repeats < 3) return;
                      repeating->stop();
                      // A one-shot started after the repeats: it fires after the first one did.
                      loop.timer("last", [&] { done.set_value(); }).start(2ms);
                    });
                    repeating->start(1ms, 1ms);
                  })
                  .is_ok());
  ASSERT_TRUE(ready(done_future));
  loop.stop();
  EXPECT_EQ(once, 1);
  EXPECT_EQ(repeats, 3);  // stopped: no fourth
}

TEST(LoopThreadTest, StopWhileBusyRunsWhatWasPostedThenTheStopHandler) {
  LoopThread loop("test");
  std::vector<std::string> order;  // loop thread only until stop() returned
  std::promise<void> busy_running;
  auto busy_running_future = busy_running.get_future();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<uint64_t> ticks{0};
  ASSERT_TRUE(loop.start(
                      [&] {
                        // A timer due at every turn: the loop is never idle.
                        loop.timer("tick", [&] { ticks.fetch_add(1, std::memory_order_relaxed); }).start(0ms, 1ms);
                      },
                      [&] {
                        order.push_back("on_stop");
                        loop.quit();
                      })
                  .is_ok());
  ASSERT_TRUE(loop.post([&] {
    order.push_back("busy");
    busy_running.set_value();
    released.wait();
  }));
  ASSERT_TRUE(ready(busy_running_future));
  ASSERT_TRUE(loop.post([&] { order.push_back("posted before stop"); }));

  std::thread stopper([&] { loop.stop(); });
  // Once stop() was called, nothing more is accepted (the loop is still in `busy`).
  const auto deadline = std::chrono::steady_clock::now() + test::scaled(5s);
  bool refused = false;
  while (!refused && std::chrono::steady_clock::now() < deadline) {
    refused = !loop.post([&] { order.push_back("posted after stop"); });
    if (!refused) std::this_thread::yield();
  }
  release.set_value();
  stopper.join();
  EXPECT_TRUE(refused);
  // Accepted before the refusal but after stop() was asked for: run before the stop handler, or
  // (if accepted after the flag) never; never after it.
  ASSERT_GE(order.size(), 3u);
  EXPECT_EQ(order[0], "busy");
  EXPECT_EQ(order[1], "posted before stop");
  EXPECT_EQ(order.back(), "on_stop");
  EXPECT_GT(ticks.load(), 0u);
}

TEST(LoopThreadTest, StopHandlerMayFinishOnALaterTurn) {
  LoopThread loop("test");
  bool finished = false;
  ASSERT_TRUE(loop.start({}, [&] {
                    // As the etcd replicator does: wait for an answer (here a timer), then quit.
                    loop.timer("finish", [&] {
                      finished = true;
                      loop.quit();
                    }).start(5ms);
                  })
                  .is_ok());
  loop.stop();
  EXPECT_TRUE(finished);
}

TEST(LoopThreadTest, StopTwiceAndBeforeStart) {
  LoopThread never("test");
  never.stop();  // not started: nothing to do
  EXPECT_FALSE(never.post([] {}));

  int stops = 0;
  LoopThread loop("test");
  ASSERT_TRUE(loop.start({}, [&] {
                    ++stops;
                    loop.quit();
                  })
                  .is_ok());
  loop.stop();
  loop.stop();
  EXPECT_EQ(stops, 1);
  EXPECT_FALSE(loop.post([] {}));
}  // and the destructor stops a third time

TEST(LoopThreadTest, AThrowingCallbackIsContained) {
  LoopThread loop("test");
  ASSERT_TRUE(loop.start([] { throw std::runtime_error("first"); }).is_ok());
  ASSERT_TRUE(loop.post([] { throw std::runtime_error("posted"); }));
  std::promise<void> after;
  auto after_future = after.get_future();
  ASSERT_TRUE(loop.post([&] { after.set_value(); }));
  ASSERT_TRUE(ready(after_future));
  loop.stop();
}

}  // namespace
}  // namespace pdr::discovery::sources
