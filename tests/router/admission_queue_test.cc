// AdmissionQueue (router/proxy/admission_queue.h): order (class, then tenants round-robin, then
// arrival), bounds, exactly-once exits (hand-off against withdraw), the drain, and that
// concurrent takers and releasers never strand a waiter. The HTTP side (waiting requests,
// deadlines, disconnects) runs against real processes in tests/integration/test_admission_queue.py.
#include "router/proxy/admission_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/time_scale.h"

namespace pdr::router::proxy {
namespace {

using Outcome = AdmissionQueue::Outcome;
using Enqueued = AdmissionQueue::Enqueued;

struct TestWaiter : AdmissionQueue::Waiter {
  TestWaiter(uint32_t priority, std::string tenant, uint64_t bytes = 1, int id = 0)
      : Waiter(priority, std::move(tenant), bytes, 0), id(id) {}
  void woken() override { ++woken_calls; }
  int id;
  int woken_calls = 0;
};

class AdmissionQueueTest : public ::testing::Test {
 protected:
  AdmissionQueueTest() {
    queue.set_notify([this](std::shared_ptr<AdmissionQueue::Waiter> w) {
      std::lock_guard<std::mutex> lock(mu);
      notified.push_back(std::static_pointer_cast<TestWaiter>(std::move(w)));
    });
  }

  std::shared_ptr<TestWaiter> waiter(uint32_t priority, const std::string& tenant, int id = 0, uint64_t bytes = 1) {
    return std::make_shared<TestWaiter>(priority, tenant, bytes, id);
  }
  Enqueued enqueue(const std::shared_ptr<TestWaiter>& w) { return queue.enqueue(w, limits); }
  // The slot of the last waiter granted is given back: the next one gets it. Returns its id.
  int serve_next() {
    queue.release();
    std::lock_guard<std::mutex> lock(mu);
    if (notified.empty()) return -1;
    auto w = notified.front();
    notified.pop_front();
    EXPECT_EQ(w->outcome(), Outcome::kGranted);
    EXPECT_TRUE(w->take_grant());
    return w->id;
  }

  std::atomic<int64_t> in_flight{0};
  AdmissionQueueCounters counters;
  AdmissionQueue queue{in_flight, counters};
  AdmissionQueue::Limits limits{1, 1000, 1u << 20};
  std::mutex mu;
  std::deque<std::shared_ptr<TestWaiter>> notified;
};

TEST_F(AdmissionQueueTest, FreeSlotsAreTakenWithoutTheQueue) {
  EXPECT_TRUE(queue.try_take(2));
  EXPECT_TRUE(queue.try_take(2));
  EXPECT_FALSE(queue.try_take(2));
  EXPECT_EQ(in_flight.load(), 2) << "a failed try counts nothing";
  queue.release();
  EXPECT_EQ(in_flight.load(), 1);
  EXPECT_TRUE(notified.empty());
}

TEST_F(AdmissionQueueTest, HigherClassFirstThenArrival) {
  ASSERT_TRUE(queue.try_take(1));
  ASSERT_EQ(enqueue(waiter(2, "a", 1)), Enqueued::kQueued);
  ASSERT_EQ(enqueue(waiter(5, "a", 2)), Enqueued::kQueued);
  ASSERT_EQ(enqueue(waiter(0, "a", 3)), Enqueued::kQueued);
  ASSERT_EQ(enqueue(waiter(5, "a", 4)), Enqueued::kQueued);
  ASSERT_EQ(enqueue(waiter(99, "a", 5)), Enqueued::kQueued);  // clamped to the highest class
  EXPECT_EQ(counters.depth[5].load(), 2u);
  EXPECT_EQ(counters.depth[kPriorityClasses - 1].load(), 1u);
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) {
    order.push_back(serve_next());
    EXPECT_EQ(in_flight.load(), 1) << "a slot handed over is never given back to the count between";
  }
  EXPECT_EQ(order, (std::vector<int>{5, 2, 4, 1, 3}));
  EXPECT_EQ(serve_next(), -1);
  EXPECT_EQ(in_flight.load(), 0);
  EXPECT_EQ(queue.waiting(), 0);
}

TEST_F(AdmissionQueueTest, TenantsAreServedRoundRobinInAClass) {
  ASSERT_TRUE(queue.try_take(1));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(enqueue(waiter(4, "a", 100 + i)), Enqueued::kQueued);
  ASSERT_EQ(enqueue(waiter(4, "b", 1)), Enqueued::kQueued);
  ASSERT_EQ(enqueue(waiter(4, "c", 2)), Enqueued::kQueued);
  ASSERT_EQ(enqueue(waiter(4, "b", 3)), Enqueued::kQueued);
  std::vector<int> first;
  for (int i = 0; i < 6; ++i) first.push_back(serve_next());
  // A's burst came first, yet B and C each wait at most one turn per other tenant.
  EXPECT_EQ(first, (std::vector<int>{100, 1, 2, 101, 3, 102}));
  int expected = 103;
  for (int i = 0; i < 97; ++i) EXPECT_EQ(serve_next(), expected++) << "a tenant's own requests keep their order";
  EXPECT_EQ(serve_next(), -1);
}

TEST_F(AdmissionQueueTest, ALateTenantIsServedWithinTheFirstTwo) {
  ASSERT_TRUE(queue.try_take(1));
  for (int i = 0; i < 100; ++i) ASSERT_EQ(enqueue(waiter(4, "a", 100 + i)), Enqueued::kQueued);
  ASSERT_EQ(enqueue(waiter(4, "b", 1)), Enqueued::kQueued);
  const int one = serve_next(), two = serve_next();
  EXPECT_TRUE(one == 1 || two == 1) << one << ", " << two;
}

TEST(QueuePriority, TheHeaderLowersButNeverRaisesAKeyedTenant) {
  uint32_t p = 99;
  EXPECT_TRUE(queue_priority(std::nullopt, 5, false, &p));
  EXPECT_EQ(p, 5u);
  EXPECT_TRUE(queue_priority("2", 5, false, &p));
  EXPECT_EQ(p, 2u);
  EXPECT_TRUE(queue_priority("7", 5, false, &p));
  EXPECT_EQ(p, 5u) << "raised above the tenant's class";
  EXPECT_TRUE(queue_priority(" 0 ", 5, false, &p));
  EXPECT_EQ(p, 0u);
  // Without client keys the header sets the class within the range.
  EXPECT_TRUE(queue_priority("7", 4, true, &p));
  EXPECT_EQ(p, 7u);
  EXPECT_TRUE(queue_priority(std::nullopt, 40, true, &p));
  EXPECT_EQ(p, kPriorityClasses - 1);
  p = 3;
  for (const char* bad : {"8", "-1", "", "high", "11", "1.0", "0x1"}) {
    EXPECT_FALSE(queue_priority(std::string_view(bad), 5, true, &p)) << bad;
    EXPECT_EQ(p, 3u);
  }
}

TEST_F(AdmissionQueueTest, AWithdrawAfterTheHandOffFindsTheGrant) {
  ASSERT_TRUE(queue.try_take(1));
  auto w = waiter(4, "a", 1);
  ASSERT_EQ(enqueue(w), Enqueued::kQueued);
  queue.release();  // the hand-off comes first
  EXPECT_EQ(queue.withdraw(*w), Outcome::kGranted) << "the deadline lost the race: the slot is the waiter's";
  EXPECT_EQ(in_flight.load(), 1);
  EXPECT_TRUE(w->take_grant());
  EXPECT_FALSE(w->take_grant()) << "taken once";
  queue.release();
  EXPECT_EQ(in_flight.load(), 0);
}

TEST_F(AdmissionQueueTest, AWithdrawBeforeTheHandOffLeavesNoGrant) {
  ASSERT_TRUE(queue.try_take(1));
  auto w = waiter(4, "a", 1, 300);
  ASSERT_EQ(enqueue(w), Enqueued::kQueued);
  EXPECT_EQ(counters.bytes.load(), 300u);
  EXPECT_EQ(counters.depth[4].load(), 1u);
  EXPECT_EQ(queue.withdraw(*w), Outcome::kWaiting);
  EXPECT_EQ(w->outcome(), Outcome::kWithdrawn);
  EXPECT_EQ(counters.bytes.load(), 0u) << "its bytes are freed at once";
  EXPECT_EQ(counters.depth[4].load(), 0u);
  EXPECT_EQ(queue.withdraw(*w), Outcome::kWithdrawn) << "once";
  queue.release();
  EXPECT_EQ(in_flight.load(), 0) << "nobody waits: the slot goes back to the count";
  EXPECT_TRUE(notified.empty());
  EXPECT_FALSE(w->take_grant());
}

TEST_F(AdmissionQueueTest, HandOffAndWithdrawRaceIsDecidedOnce) {
  const int rounds = 2000;
  int granted = 0, withdrawn = 0;
  for (int i = 0; i < rounds; ++i) {
    ASSERT_TRUE(queue.try_take(1));
    auto w = waiter(4, "a", i);
    ASSERT_EQ(enqueue(w), Enqueued::kQueued);
    Outcome seen = Outcome::kWaiting;
    std::thread deadline([&] { seen = queue.withdraw(*w); });
    queue.release();
    deadline.join();
    if (seen == Outcome::kWaiting) {
      ++withdrawn;
      EXPECT_EQ(in_flight.load(), 0);
      EXPECT_FALSE(w->take_grant());
    } else {
      ++granted;
      EXPECT_EQ(seen, Outcome::kGranted);
      EXPECT_TRUE(w->take_grant());
      queue.release();
    }
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(notified.size(), seen == Outcome::kGranted ? 1u : 0u) << "notified exactly when granted";
    notified.clear();
    ASSERT_EQ(in_flight.load(), 0);
  }
  EXPECT_EQ(granted + withdrawn, rounds);
}

TEST_F(AdmissionQueueTest, CountAndByteBounds) {
  limits.max_requests = 2;
  limits.max_bytes = 250;
  ASSERT_TRUE(queue.try_take(1));
  EXPECT_EQ(enqueue(waiter(4, "a", 1, 100)), Enqueued::kQueued);
  EXPECT_EQ(enqueue(waiter(4, "b", 2, 151)), Enqueued::kFullBytes);
  EXPECT_EQ(enqueue(waiter(4, "b", 3, 150)), Enqueued::kQueued);
  EXPECT_EQ(enqueue(waiter(7, "c", 4, 1)), Enqueued::kFullRequests) << "whatever its class";
  EXPECT_EQ(counters.bytes.load(), 250u);
  EXPECT_EQ(queue.waiting(), 2);
  EXPECT_FALSE(queue.try_take(100)) << "a newcomer never passes a waiter";
  EXPECT_EQ(in_flight.load(), 1);
  limits.max_requests = 0;
  EXPECT_EQ(enqueue(waiter(4, "d", 5, 1)), Enqueued::kFullRequests) << "0: no queue";
}

TEST_F(AdmissionQueueTest, ASlotFreedBeforeTheEnqueueIsGrantedAtOnce) {
  limits.max_concurrent = 2;
  ASSERT_TRUE(queue.try_take(2));
  // try_take failed a moment ago (both slots were held); one came back since.
  auto w = waiter(4, "a", 1);
  EXPECT_EQ(enqueue(w), Enqueued::kGranted);
  EXPECT_EQ(in_flight.load(), 2);
  EXPECT_FALSE(w->take_grant()) << "the caller holds it already";
  EXPECT_TRUE(notified.empty());
  EXPECT_EQ(queue.waiting(), 0);
}

TEST_F(AdmissionQueueTest, ShutDownTellsEveryWaiterAndRefusesNewOnes) {
  ASSERT_TRUE(queue.try_take(1));
  for (int i = 0; i < 3; ++i) ASSERT_EQ(enqueue(waiter(i, "a", i)), Enqueued::kQueued);
  queue.shut_down();
  ASSERT_EQ(notified.size(), 3u);
  for (const auto& w : notified) EXPECT_EQ(w->outcome(), Outcome::kShutDown);
  EXPECT_EQ(enqueue(waiter(4, "a", 9)), Enqueued::kShutDown);
  EXPECT_EQ(queue.waiting(), 0);
  EXPECT_EQ(counters.bytes.load(), 0u);
  queue.release();
  EXPECT_EQ(in_flight.load(), 0);
}

TEST(AdmissionQueue, AGrantNobodyTookIsGivenBack) {
  std::atomic<int64_t> in_flight{0};
  AdmissionQueueCounters counters;
  AdmissionQueue queue(in_flight, counters);  // no notify: a grant's waiter is dropped at once
  ASSERT_TRUE(queue.try_take(1));
  ASSERT_EQ(queue.enqueue(std::make_shared<TestWaiter>(4, "a"), {1, 10, 100}), Enqueued::kQueued);
  queue.release();  // handed to the waiter, which nobody will run
  EXPECT_EQ(in_flight.load(), 0);
  EXPECT_EQ(queue.waiting(), 0);
}

// Takers and releasers on several threads, the queue between them: every request is served,
// none waits for ever (a stranded waiter would hang until the bound below).
TEST(AdmissionQueue, ConcurrentTakersAndReleasersStrandNobody) {
  std::atomic<int64_t> in_flight{0};
  AdmissionQueueCounters counters;
  AdmissionQueue queue(in_flight, counters);
  constexpr uint32_t kLimit = 2;
  constexpr int kThreads = 4, kPerThread = 3000;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<AdmissionQueue::Waiter>> mailbox;
  std::atomic<int> served{0}, queued{0};
  std::atomic<int64_t> over_limit{0};
  queue.set_notify([&](std::shared_ptr<AdmissionQueue::Waiter> w) {
    std::lock_guard<std::mutex> lock(mu);
    mailbox.push_back(std::move(w));
    cv.notify_one();
  });
  auto run = [&] {  // what an admitted request does: counts itself and gives its slot back
    if (in_flight.load() > kLimit) over_limit.fetch_add(1);
    std::this_thread::yield();  // holds the slot a moment: the others must queue
    served.fetch_add(1);
    queue.release();
  };
  std::atomic<bool> stop{false};
  std::thread worker([&] {  // the waiters' worker loop
    std::unique_lock<std::mutex> lock(mu);
    while (!stop.load()) {
      if (mailbox.empty()) {
        cv.wait_for(lock, std::chrono::milliseconds(5));
        continue;
      }
      auto w = std::move(mailbox.front());
      mailbox.pop_front();
      lock.unlock();
      if (w->take_grant()) run();
      w.reset();
      lock.lock();
    }
  });
  // Every slot held at the start: the takers' first requests must queue, however the threads
  // are scheduled.
  for (uint32_t i = 0; i < kLimit; ++i) ASSERT_TRUE(queue.try_take(kLimit));
  std::vector<std::thread> takers;
  for (int t = 0; t < kThreads; ++t) {
    takers.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        if (queue.try_take(kLimit)) {
          run();
          continue;
        }
        auto w = std::make_shared<TestWaiter>(static_cast<uint32_t>(i % 3), "t" + std::to_string(t % 2));
        const Enqueued e = queue.enqueue(w, {kLimit, 1'000'000, 1ull << 40});
        ASSERT_NE(e, Enqueued::kFullRequests);
        if (e == Enqueued::kGranted) run();
        if (e == Enqueued::kQueued) queued.fetch_add(1);
      }
    });
  }
  const auto first_wait = std::chrono::steady_clock::now() + test::scaled(std::chrono::seconds(10));
  while (queue.waiting() == 0 && std::chrono::steady_clock::now() < first_wait) std::this_thread::yield();
  for (uint32_t i = 0; i < kLimit; ++i) queue.release();
  for (auto& t : takers) t.join();
  const auto deadline = std::chrono::steady_clock::now() + test::scaled(std::chrono::seconds(20));
  while (served.load() < kThreads * kPerThread && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop.store(true);
  worker.join();
  EXPECT_EQ(served.load(), kThreads * kPerThread) << "waiters left stranded: " << queue.waiting();
  EXPECT_EQ(in_flight.load(), 0);
  EXPECT_EQ(queue.waiting(), 0);
  EXPECT_EQ(over_limit.load(), 0);
  EXPECT_GT(queued.load(), 0) << "nothing waited: the test did not test the queue";
}

// The narrowest race, round after round: the only slot comes back while a taker that just found
// it held joins the queue. Each round must end with the slot in use by the waiter or free and
// nobody waiting; never a waiter and a free slot.
TEST(AdmissionQueue, ASlotGivenBackWhileATakerJoinsTheQueueReachesIt) {
  std::atomic<int64_t> in_flight{0};
  AdmissionQueueCounters counters;
  AdmissionQueue queue(in_flight, counters);
  const int rounds = 20000;
  std::barrier sync(2);
  std::atomic<int> stranded{0};
  std::thread releaser([&] {
    for (int i = 0; i < rounds; ++i) {
      sync.arrive_and_wait();  // the slot is held
      queue.release();
      sync.arrive_and_wait();  // round over
      sync.arrive_and_wait();  // checked
    }
  });
  for (int i = 0; i < rounds; ++i) {
    ASSERT_TRUE(queue.try_take(1));
    sync.arrive_and_wait();
    auto w = std::make_shared<TestWaiter>(4, "a");
    bool mine = queue.try_take(1);
    if (!mine) mine = queue.enqueue(w, {1, 10, 100}) == Enqueued::kGranted;
    sync.arrive_and_wait();
    if (!mine && w->outcome() == Outcome::kWaiting && in_flight.load() == 0) stranded.fetch_add(1);
    if (!mine && queue.withdraw(*w) == Outcome::kGranted) mine = w->take_grant();
    if (mine) queue.release();
    ASSERT_EQ(in_flight.load(), 0);
    sync.arrive_and_wait();
  }
  releaser.join();
  EXPECT_EQ(stranded.load(), 0);
}

}  // namespace
}  // namespace pdr::router::proxy
