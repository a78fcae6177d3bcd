#include "transfer/core/completion.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace pdr::transfer {
namespace {

using namespace std::chrono_literals;

bool readable(int fd, int timeout_ms) {
  pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN) != 0;
}

void count_call(void* context, const XferResult&) {
  static_cast<std::atomic<int>*>(context)->fetch_add(1);
}

const XferResult kDone{XferState::kDone, XferCause::kNone, 4096};

TEST(Completion, PollIsPendingThenFinal) {
  Completion c;
  EXPECT_EQ(c.poll().state, XferState::kPending);
  EXPECT_TRUE(c.complete(kDone));
  EXPECT_EQ(c.poll(), kDone);
  // Only the first completion counts.
  EXPECT_FALSE(c.complete({XferState::kFailed, XferCause::kPeerGone, 0}));
  EXPECT_EQ(c.poll(), kDone);
}

TEST(Completion, PendingIsNotAFinalState) {
  Completion c;
  EXPECT_FALSE(c.complete({XferState::kPending, XferCause::kNone, 1}));
  EXPECT_EQ(c.poll().state, XferState::kPending);
}

TEST(Completion, WaitTimesOutAtTheDeadline) {
  Completion c;
  const auto start = Completion::Clock::now();
  XferResult r = c.wait_for(50ms);
  EXPECT_EQ(r.state, XferState::kPending);
  EXPECT_GE(Completion::Clock::now() - start, 50ms);
  EXPECT_EQ(c.wait_until(Completion::Clock::now() - 1s).state, XferState::kPending);  // past
}

TEST(Completion, WaitReturnsWhenAnotherThreadCompletes) {
  Completion c;
  std::thread completer([&] {
    std::this_thread::sleep_for(20ms);
    c.complete({XferState::kFailed, XferCause::kTimeout, 123});
  });
  XferResult r = c.wait_for(10s);
  EXPECT_EQ(r, (XferResult{XferState::kFailed, XferCause::kTimeout, 123}));
  completer.join();
}

TEST(Completion, WaitWithoutDeadlineBlocksUntilCompletion) {
  Completion c;
  std::atomic<bool> completed{false};
  std::thread completer([&] {
    std::this_thread::sleep_for(30ms);
    completed.store(true);
    c.complete(kDone);
  });
  EXPECT_EQ(c.wait(), kDone);
  EXPECT_TRUE(completed.load());
  completer.join();
}

TEST(Completion, EventFdTurnsReadableOnCompletion) {
  Completion c;
  const int fd = c.event_fd();
  ASSERT_GE(fd, 0);
  EXPECT_EQ(c.event_fd(), fd);  // one fd per completion
  EXPECT_FALSE(readable(fd, 0));
  std::thread completer([&] {
    std::this_thread::sleep_for(10ms);
    c.complete(kDone);
  });
  EXPECT_TRUE(readable(fd, 10000));
  completer.join();
  EXPECT_EQ(c.poll(), kDone);
}

TEST(Completion, EventFdCreatedAfterCompletionIsAlreadyReadable) {
  Completion c;
  c.complete(kDone);
  const int fd = c.event_fd();
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(readable(fd, 0));
}

TEST(Completion, EventFdWorksWithEpoll) {
  Completion c;
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &c;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, c.event_fd(), &ev), 0);
  epoll_event got{};
  EXPECT_EQ(::epoll_wait(ep, &got, 1, 0), 0);
  std::thread completer([&] { c.complete(kDone); });
  EXPECT_EQ(::epoll_wait(ep, &got, 1, 10000), 1);
  EXPECT_EQ(got.data.ptr, &c);
  completer.join();
  ::close(ep);
}

TEST(Completion, CallbackFiresOnceWithTheResult) {
  struct Seen {
    std::atomic<int> calls{0};
    XferResult result;
  } seen;
  Completion c;
  ASSERT_TRUE(c.set_callback(
      [](void* ctx, const XferResult& r) {
        auto* s = static_cast<Seen*>(ctx);
        s->result = r;
        s->calls.fetch_add(1);
      },
      &seen));
  std::atomic<int> other{0};
  EXPECT_FALSE(c.set_callback(count_call, &other));  // one callback per arm
  EXPECT_EQ(seen.calls.load(), 0);
  c.complete(kDone);
  c.complete({XferState::kCancelled, XferCause::kCancelled, 0});
  EXPECT_EQ(seen.calls.load(), 1);
  EXPECT_EQ(seen.result, kDone);
  EXPECT_EQ(other.load(), 0);
}

TEST(Completion, CallbackSetAfterCompletionRunsImmediately) {
  Completion c;
  c.complete(kDone);
  std::atomic<int> calls{0};
  EXPECT_TRUE(c.set_callback(count_call, &calls));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_FALSE(c.set_callback(count_call, &calls));
  EXPECT_EQ(calls.load(), 1);
}

TEST(Completion, RearmResetsEverything) {
  Completion c;
  const int fd = c.event_fd();
  std::atomic<int> calls{0};
  ASSERT_TRUE(c.set_callback(count_call, &calls));
  c.complete(kDone);
  EXPECT_TRUE(readable(fd, 0));
  c.rearm();
  EXPECT_EQ(c.poll().state, XferState::kPending);
  EXPECT_FALSE(readable(fd, 0));
  ASSERT_TRUE(c.set_callback(count_call, &calls));
  EXPECT_TRUE(c.complete({XferState::kCancelled, XferCause::kCancelled, 7}));
  EXPECT_EQ(calls.load(), 2);
  EXPECT_TRUE(readable(fd, 0));
  EXPECT_EQ(c.poll().cause, XferCause::kCancelled);
}

// Many completions, each raced by: several completers (exactly one wins), waiters, a poller, an
// eventfd watcher and a callback registered concurrently. Run under TSan too.
TEST(Completion, RacingCompletersWaitersAndCallbacks) {
  constexpr int kRounds = 300;
  for (int round = 0; round < kRounds; ++round) {
    auto c = std::make_unique<Completion>();
    const int fd = c->event_fd();
    ASSERT_GE(fd, 0);
    std::atomic<int> wins{0};
    std::atomic<int> callbacks{0};
    std::atomic<int> finals_seen{0};
    std::vector<std::thread> threads;
    for (int w = 0; w < 2; ++w) {
      threads.emplace_back([&] {
        if (c->wait_for(10s).state == XferState::kDone) finals_seen.fetch_add(1);
      });
    }
    threads.emplace_back([&] {
      while (c->poll().state == XferState::kPending) std::this_thread::yield();
      finals_seen.fetch_add(1);
    });
    threads.emplace_back([&] {
      if (readable(fd, 10000)) finals_seen.fetch_add(1);
    });
    threads.emplace_back([&] { EXPECT_TRUE(c->set_callback(count_call, &callbacks)); });
    for (int k = 0; k < 3; ++k) {
      threads.emplace_back([&, k] {
        if (c->complete({XferState::kDone, XferCause::kNone, static_cast<std::uint64_t>(k)})) {
          wins.fetch_add(1);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    ASSERT_EQ(wins.load(), 1) << "round " << round;
    ASSERT_EQ(callbacks.load(), 1) << "round " << round;
    ASSERT_EQ(finals_seen.load(), 4) << "round " << round;
  }
}

// The owner may destroy the Completion as soon as it sees the final state, while complete() is
// still returning on the backend thread (ASan/TSan would flag a use after free).
TEST(Completion, OwnerDestroysRightAfterSeeingFinalState) {
  for (int round = 0; round < 500; ++round) {
    auto* c = new Completion();
    std::atomic<int> calls{0};
    ASSERT_TRUE(c->set_callback(count_call, &calls));
    std::thread completer([c] { c->complete(kDone); });
    if (round % 2 == 0) {
      while (c->poll().state == XferState::kPending) std::this_thread::yield();
    } else {
      c->wait();
    }
    delete c;
    completer.join();
    EXPECT_EQ(calls.load(), 1);
  }
}

}  // namespace
}  // namespace pdr::transfer
