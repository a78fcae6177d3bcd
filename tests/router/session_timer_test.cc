#include "router/proxy/session_timer.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <memory>

namespace pdr::router::proxy {
namespace {

using namespace std::chrono_literals;

class SessionTimerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(uv_loop_init(&loop_), 0); }
  void TearDown() override {
    // Closed handles finish closing on the loop's next run.
    uv_run(&loop_, UV_RUN_DEFAULT);
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }
  uv_loop_t loop_{};
};

TEST_F(SessionTimerTest, FiresOnceAfterItsDelay) {
  SessionTimer timer;
  int fired = 0;
  const uint64_t start = uv_now(&loop_);
  ASSERT_TRUE(timer.start(&loop_, 20ms, [&] { ++fired; }));
  EXPECT_TRUE(timer.armed());
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(fired, 1);
  EXPECT_GE(uv_now(&loop_) - start, 20u);
  EXPECT_FALSE(timer.armed());
}

TEST_F(SessionTimerTest, StopAndRestartReplaceThePendingCallback) {
  SessionTimer timer;
  int first = 0, second = 0;
  ASSERT_TRUE(timer.start(&loop_, 10ms, [&] { ++first; }));
  timer.stop();
  EXPECT_FALSE(timer.armed());
  ASSERT_TRUE(timer.start(&loop_, 10ms, [&] { ++first; }));
  ASSERT_TRUE(timer.start(&loop_, 0ms, [&] { ++second; }));
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 1);
}

TEST_F(SessionTimerTest, NeverFiresOnceDestroyed) {
  int fired = 0;
  {
    SessionTimer timer;
    ASSERT_TRUE(timer.start(&loop_, 0ms, [&] { ++fired; }));
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
  ASSERT_TRUE(owner->timer.start(&loop_, 0ms, [&owner, &seen] {
    seen = owner->value;
    owner.reset();
  }));
  uv_run(&loop_, UV_RUN_DEFAULT);
  EXPECT_EQ(seen, 7);
  EXPECT_EQ(owner, nullptr);
}

}  // namespace
}  // namespace pdr::router::proxy
