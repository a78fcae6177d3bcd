// Where requests whose SLO (slo_headers.h) no candidate is predicted to meet wait for one that
// is (policies.predicted_latency without shed). A waiting request holds its admission slot and
// has sent no leg; it re-runs its pairing whenever a leg ends anywhere in the process (a prefill
// answered, a decode finished, a request released its pair) and whenever the registry changes (a
// node joined, left or changed state: ProxyShared::forget_departed_nodes), which is when
// predictions change:
// wake() posts each parked re-check to its own worker once, and the re-check parks itself again
// if its SLO is still out of reach. No polling: an idle process with waiters does nothing until
// a leg ends, the registry changes or a waiter's deadline (limits.queue_timeout_ms, then 503 queue_timeout) fires.
//
// Threads: park() and wake() from any worker; one mutex guards the list, never held while a
// callback runs. wake() with nobody parked is one relaxed atomic load.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <utility>
#include <vector>

namespace pdr::router::routing {

class SloGate {
 public:
  using Post = std::function<void(uint32_t worker, std::function<void()> fn)>;

  // How re-checks reach their worker (ProxyService: Server::post). Before the first park();
  // without it, wake() runs the re-checks on the calling thread (tests).
  void set_post(Post post) { post_ = std::move(post); }

  // `recheck` runs on `worker` at the next wake(); until then the gate holds it (and what it
  // captures: the waiting session). Returns a ticket for withdraw().
  uint64_t park(uint32_t worker, std::function<void()> recheck);
  // Drops a parked re-check that was not woken yet (the waiter's deadline passed); true if it
  // was still parked. The re-check is destroyed on the calling thread, outside the lock.
  bool withdraw(uint64_t ticket);
  // Something that predictions read changed: every parked re-check is handed to its worker.
  void wake();

  // Drops every parked re-check unrun (the proxy's teardown, while the workers still exist).
  void drop_all();

  uint64_t parked() const { return parked_.load(std::memory_order_relaxed); }
  // Re-checks handed out by wake() so far (tests: waking is event-driven).
  uint64_t rechecks() const { return rechecks_.load(std::memory_order_relaxed); }

 private:
  Post post_;
  std::mutex mutex_;
  struct Parked {
    uint64_t ticket;
    uint32_t worker;
    std::function<void()> recheck;
  };
  std::vector<Parked> waiting_;
  uint64_t next_ticket_ = 1;
  std::atomic<uint64_t> parked_{0};
  std::atomic<uint64_t> rechecks_{0};
};

}  // namespace pdr::router::routing
