// AdmissionSlot (router/proxy/admission.h): what an admitted request holds is given back exactly
// once, whichever way it ends. The refusals themselves run against real sims in
// tests/integration/test_endpoints.py (OneNodeAdmission) and test_proxy_requests.py; the queue's
// deadline against a worker that runs late is tested here, on a real HTTP worker.
#include "router/proxy/admission.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "proto/base/snapshot_cell.h"
#include "router/http/http_server.h"
#include "tests/support/http_client.h"
#include "tests/support/time_scale.h"

namespace pdr::router::proxy {
namespace {

// What admission (admit_or_queue) counts before it hands out a slot.
AdmissionSlot take(ProxyCounters& c, size_t bytes) {
  c.in_flight.fetch_add(1);
  EXPECT_TRUE(c.buffered.reserve(bytes, 0));
  return AdmissionSlot(c, bytes);
}

TEST(AdmissionSlot, ReleaseGivesBothBackOnce) {
  ProxyCounters c;
  AdmissionSlot slot = take(c, 100);
  EXPECT_TRUE(slot.held());
  EXPECT_EQ(c.in_flight.load(), 1);
  EXPECT_EQ(c.buffered.held.load(), 100);
  slot.release();
  EXPECT_FALSE(slot.held());
  EXPECT_EQ(c.in_flight.load(), 0);
  EXPECT_EQ(c.buffered.held.load(), 0);
  slot.release();  // a second end (a close after a failure) takes nothing more
  EXPECT_EQ(c.in_flight.load(), 0);
  EXPECT_EQ(c.buffered.held.load(), 0);
}

TEST(AdmissionSlot, DestructionReleasesWhatWasNotReleased) {
  ProxyCounters c;
  {
    AdmissionSlot slot = take(c, 7);
    EXPECT_EQ(c.in_flight.load(), 1);
  }
  EXPECT_EQ(c.in_flight.load(), 0);
  EXPECT_EQ(c.buffered.held.load(), 0);
  {
    AdmissionSlot slot = take(c, 7);
    slot.release();
  }
  EXPECT_EQ(c.in_flight.load(), 0);
  EXPECT_EQ(c.buffered.held.load(), 0);
}

TEST(AdmissionSlot, MovesCarryTheSlot) {
  ProxyCounters c;
  std::optional<AdmissionSlot> taken = take(c, 5);
  AdmissionSlot holder;
  EXPECT_FALSE(holder.held());
  holder = *std::move(taken);
  taken.reset();  // the moved-from slot gives nothing back
  EXPECT_EQ(c.in_flight.load(), 1);
  AdmissionSlot other = take(c, 3);
  holder = std::move(other);  // assigning over a held slot releases it first
  EXPECT_EQ(c.in_flight.load(), 1);
  EXPECT_EQ(c.buffered.held.load(), 3);
  holder.release();
  EXPECT_EQ(c.in_flight.load(), 0);
  EXPECT_EQ(c.buffered.held.load(), 0);
}

TEST(AdmissionSlot, HandOverLeavesTheCountsToTheNewOwner) {
  ProxyCounters c;
  {
    AdmissionSlot slot = take(c, 9);
    slot.hand_over();
    EXPECT_FALSE(slot.held());
  }
  EXPECT_EQ(c.in_flight.load(), 1);  // the session gives them back when it ends
  EXPECT_EQ(c.buffered.held.load(), 9);
}

// A request queued behind the only slot, whose slot is handed over only after its deadline
// passed: its worker's loop was busy (here, a task that holds it) when the deadline came, and
// the releaser's hand-off reached the queue before the deadline's callback could run. It must be
// answered as its deadline says (503 queue_timeout) and the slot passed on, not admitted late.
TEST(AdmissionQueueDeadline, ASlotHandedOverAfterTheDeadlineIsPassedOnNotUsed) {
  using namespace std::chrono_literals;
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(test::scaled(300ms));
  auto topology = std::make_shared<config::Topology>();
  topology->limits.max_concurrent_requests = 1;
  topology->limits.queue_timeout = timeout;
  SnapshotCell<config::Topology> topology_cell;
  topology_cell.publish(topology);
  SnapshotCell<discovery::RegistrySnapshot> registry_cell;
  registry_cell.publish(std::make_shared<discovery::RegistrySnapshot>());
  ProxyShared shared;
  shared.registry = &registry_cell;
  shared.topology = &topology_cell;
  ASSERT_TRUE(shared.admission_queue.try_take(1));  // the test holds the only slot

  struct Outcome {
    std::atomic<bool> admitted{false};
    std::atomic<int> refused_status{0};
  };
  auto outcome = std::make_shared<Outcome>();
  struct Then {
    std::shared_ptr<Outcome> out;
    void admitted(http::Request&, http::ResponseWriter writer, AdmissionSlot, const QueueWait&) {
      out->admitted = true;
      writer.send(http::Response::json(200, "{}"));
    }
    void refused(http::Request&, const Answered& answered) { out->refused_status = answered.status; }
  };
  std::unique_ptr<WorkerContext> context;  // worker thread only
  http::Server server;
  // A waiter granted a slot is told on its worker's loop (as ProxyService wires it).
  shared.admission_queue.set_notify([&server](std::shared_ptr<AdmissionQueue::Waiter> waiter) {
    const uint32_t index = waiter->worker();  // before the move below
    server.post(index, [waiter = std::move(waiter)] { waiter->woken(); });
  });
  http::ServerOptions options;
  options.host = "127.0.0.1";
  options.workers = 1;
  options.on_worker_stop = [&context](uint32_t) { context.reset(); };
  ASSERT_TRUE(server
                  .start(options,
                         [&](http::Request&& request, http::ResponseWriter writer) {
                           if (!context) context = std::make_unique<WorkerContext>(shared, 0, server.loop(0));
                           admit_or_queue(*context, request, writer, 2, QueuePlace{}, Then{outcome});
                         })
                  .is_ok());
  test::HttpClient client;
  ASSERT_EQ(client.connect("127.0.0.1", server.port()), "");
  ASSERT_EQ(client.send_request("POST", "/v1/completions", {{"Content-Type", "application/json"}}, "{}"), "");
  const auto queued_by = std::chrono::steady_clock::now() + test::scaled(10s);
  while (shared.admission_queue.waiting() != 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), queued_by) << "the request never queued";
    std::this_thread::sleep_for(1ms);
  }
  // The worker is held past the deadline; the slot is given back while it is held, so the
  // hand-off is already made when the loop runs the deadline's callback and the grant's post.
  std::promise<bool> held;
  server.post(0, [&] {
    const bool still_waiting = shared.admission_queue.waiting() == 1;
    std::this_thread::sleep_for(timeout + timeout / 2);
    give_back_slot(shared);
    held.set_value(still_waiting);
  });
  ASSERT_TRUE(held.get_future().get()) << "the deadline passed before the worker was held";
  const test::HttpResponse answer =
      client.read_response(std::chrono::duration_cast<std::chrono::milliseconds>(test::scaled(10s)));
  ASSERT_TRUE(answer.ok()) << answer.error;
  EXPECT_EQ(answer.status, 503);
  EXPECT_NE(answer.body.find("queue_timeout"), std::string::npos) << answer.body;
  EXPECT_FALSE(outcome->admitted.load());
  EXPECT_EQ(outcome->refused_status.load(), 503);
  // The slot went back: nothing holds it, nobody waits.
  std::promise<void> checked;
  int64_t waiting = -1;
  server.post(0, [&] {
    waiting = shared.admission_queue.waiting();
    checked.set_value();
  });
  checked.get_future().wait();
  EXPECT_EQ(waiting, 0);
  EXPECT_EQ(shared.counters.in_flight.load(), 0);
  server.stop(0ms);
}

}  // namespace
}  // namespace pdr::router::proxy
