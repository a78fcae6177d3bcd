// AdmissionQueue: where a client request waits for an in-flight slot (limits.max_concurrent_requests)
// instead of being refused at once, shared by every HTTP worker.
//
// Order: by priority class (0 lowest .. kPriorityClasses - 1 highest; the higher class is served
// first), then inside a class each tenant has its own FIFO and the tenants with waiters are
// served round-robin, one request per turn, so a burst of one tenant cannot starve the others
// (a burst of 100 from A then one from B: B is served second).
//
// Bounds: at most `max_requests` waiters and `max_bytes` of their bodies at once (enqueue()
// refuses beyond either, the caller answers 429). A waiter leaves the queue exactly once:
//   granted    a slot was handed to it (release() passes a slot straight to the head waiter: the
//              in-flight count neither drops nor rises, so no other request can take it between)
//   withdrawn  its worker took it out (deadline, client gone): withdraw() says which of the two
//              came first, so a deadline racing a hand-off is resolved once, under the lock
//   shut down  shut_down() empties the queue (the drain): every waiter is told, later enqueues
//              are refused
// Granted and shut-down waiters are told through `notify` (set_notify), called after the lock is
// dropped, with the waiter; pdrouter's notify posts to the waiter's worker loop (Server::post),
// which calls Waiter::woken() there.
//
// The slot count itself is `in_flight` (pdrouter_requests_in_flight): slots taken without the
// queue (try_take: a slot is free and nobody waits) cost a load and a compare-and-swap, no lock.
// The reasoning that a waiter cannot be stranded by a slot given back at the same time is in
// admission_queue.cc.
//
// Threads: every method from any thread. One mutex guards the queue; it is held for a few
// pointer moves, never while a callback runs, and nothing is allocated under it but for a rare
// growth of a class's tenant index (each waiter brings its tenant's index node with it, see
// Waiter).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "router/proxy/admission_queue_counters.h"

namespace pdr::router::proxy {

// The request header that may lower a request's class (docs/topology.md, "Admission queue").
inline constexpr std::string_view kPriorityHeader = "x-pdr-priority";
// Without a tenant priority configured (tenants: priority).
inline constexpr uint32_t kDefaultPriority = 4;

// A request's class: `tenant_priority` (its tenant's, clamped to the classes), which the value of
// the priority header may lower but never raise; with `header_sets_any` (no client keys: a
// tenant is then only a claim the client makes) the header sets any class. No header: the
// tenant's. False, *out untouched, for a value that is not an integer 0..kPriorityClasses - 1.
bool queue_priority(std::optional<std::string_view> header, uint32_t tenant_priority, bool header_sets_any,
                    uint32_t* out);

class AdmissionQueue {
 public:
  class Waiter;

  // A tenant's waiters in one class, and its place in the class's round-robin ring.
  struct TenantFifo {
    Waiter* head = nullptr;
    Waiter* tail = nullptr;
    TenantFifo* ring_prev = nullptr;
    TenantFifo* ring_next = nullptr;
  };

 private:
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using FifoIndex = std::unordered_map<std::string, TenantFifo, NameHash, std::equal_to<>>;

 public:
  // How a waiter left the queue (kWaiting: it has not).
  enum class Outcome : uint8_t { kWaiting, kGranted, kWithdrawn, kShutDown };

  // One request waiting. Derive from it; the queue keeps the waiter alive while it is queued
  // and until its notify. Destroying a waiter that was granted a slot nobody took (take_grant())
  // gives the slot back, on whichever thread the last reference goes.
  class Waiter {
   public:
    // `priority` is clamped to the classes; `tenant` names its FIFO; `bytes` count against
    // max_bytes while it waits; `worker`: where notify should reach it.
    Waiter(uint32_t priority, std::string tenant, uint64_t bytes, uint32_t worker);
    virtual ~Waiter();
    Waiter(const Waiter&) = delete;
    Waiter& operator=(const Waiter&) = delete;

    // On the waiter's worker, after notify: outcome() is kGranted or kShutDown.
    virtual void woken() = 0;

    Outcome outcome() const { return outcome_.load(std::memory_order_acquire); }
    // Granted: true once, and the caller owns the slot from then on (gives it back with
    // AdmissionQueue::release()). Not granted, or taken already: false. The waiter's thread.
    bool take_grant();
    uint32_t priority() const { return priority_; }
    const std::string& tenant() const { return tenant_; }
    uint64_t bytes() const { return bytes_; }
    uint32_t worker() const { return worker_; }

   private:
    friend class AdmissionQueue;
    const uint32_t priority_;
    const std::string tenant_;
    const uint64_t bytes_;
    const uint32_t worker_;
    std::atomic<Outcome> outcome_{Outcome::kWaiting};
    bool grant_taken_ = false;
    // Under the queue's lock:
    AdmissionQueue* queue_ = nullptr;         // set by enqueue(), for a grant given back by ~Waiter
    std::shared_ptr<Waiter> self_;            // the queue's reference, from enqueue to notify
    Waiter* prev_ = nullptr;                  // in its tenant's FIFO
    Waiter* next_ = nullptr;
    TenantFifo* fifo_ = nullptr;
    Waiter* next_woken_ = nullptr;            // the list notify walks once the lock is dropped
    // The index node of its tenant's FIFO: made before the lock is taken and used by enqueue()
    // when the tenant has no FIFO in the class yet; the node of a FIFO emptied when it left.
    // Freed with the waiter, outside the lock.
    FifoIndex::node_type node_;
    FifoIndex::node_type spent_node_;
  };

  struct Limits {
    uint32_t max_concurrent = 0;  // limits.max_concurrent_requests (the slots)
    uint32_t max_requests = 0;    // waiters at once; 0: no queue
    uint64_t max_bytes = 0;       // their bytes at once; 0: no queue
  };

  enum class Enqueued : uint8_t {
    kGranted,       // a slot was free after all: the caller holds it now (no notify comes)
    kQueued,        // waiting: notify comes, unless withdraw() takes it out first
    kFullRequests,  // max_requests waiters already
    kFullBytes,     // its bytes would take the queue over max_bytes
    kShutDown,      // shut_down() was called
  };

  using Notify = std::function<void(std::shared_ptr<Waiter>)>;

  // `in_flight`: the slot count (ProxyCounters::in_flight); `counters`: the queue's gauges. Both
  // outlive the queue.
  AdmissionQueue(std::atomic<int64_t>& in_flight, AdmissionQueueCounters& counters);
  ~AdmissionQueue();
  AdmissionQueue(const AdmissionQueue&) = delete;
  AdmissionQueue& operator=(const AdmissionQueue&) = delete;

  // Before the first waiter; not thread-safe against the queue's use.
  void set_notify(Notify notify) { notify_ = std::move(notify); }

  // A slot when one is free below `max_concurrent` and nobody waits (a newcomer never passes
  // a waiter). No lock.
  bool try_take(uint32_t max_concurrent);
  // A slot when one is free, waiters or not: for a configuration without a queue (a reload may
  // have turned it off while requests still wait).
  bool take_without_queue(uint32_t max_concurrent);
  // After try_take() failed: queues `waiter` (or grants it a slot freed meanwhile, see Enqueued).
  Enqueued enqueue(const std::shared_ptr<Waiter>& waiter, const Limits& limits);
  // Takes `waiter` out if it still waits: returns kWaiting (it is out now, its bytes freed, no
  // notify comes), else how it left before (kGranted: the slot is the waiter's, take_grant()).
  Outcome withdraw(Waiter& waiter);
  // Gives one slot back: to the head waiter when there is one (and the slots are not over the
  // last max_concurrent seen, which a reload may have lowered), else to the count.
  void release();
  // The drain: every waiter leaves with kShutDown (notified); enqueue() refuses from now on.
  void shut_down();

  // Lock-free reads (gauges; exact only when nothing moves).
  int64_t waiting() const { return waiting_.load(std::memory_order_relaxed); }
  uint64_t waiting_bytes() const { return counters_.bytes.load(std::memory_order_relaxed); }
  uint32_t depth(uint32_t priority) const { return counters_.depth[priority].load(std::memory_order_relaxed); }
  std::atomic<int64_t>& in_flight() { return in_flight_; }

 private:
  struct Class {
    FifoIndex index;               // tenants with waiters in the class
    TenantFifo* cursor = nullptr;  // the tenant served next; null: no waiter in the class
  };

  bool take_slot(int64_t limit);
  // Under the lock: the next waiter by class then round-robin, unlinked; null if none.
  Waiter* pop_next();
  // Under the lock: unlinks `w` from its FIFO (and its FIFO from the ring and index when empty).
  void unlink(Waiter* w);
  // Under the lock: `w` leaves with `outcome` onto the list *woken (notified after the lock).
  void leave(Waiter* w, Outcome outcome, Waiter** woken);
  // Under the lock: hands free slots (below the last max_concurrent) to waiters.
  void grant_free_slots(Waiter** woken);
  // Without the lock: notifies each waiter of the list and drops the queue's references.
  void notify_all(Waiter* woken);

  std::atomic<int64_t>& in_flight_;
  AdmissionQueueCounters& counters_;
  Notify notify_;
  std::atomic<int64_t> waiting_{0};          // waiters linked now (written under the lock)
  std::atomic<int64_t> max_concurrent_{0};   // the last limit a taker named (for release())
  std::mutex mu_;
  bool shut_down_ = false;
  std::array<Class, kPriorityClasses> classes_;
};

}  // namespace pdr::router::proxy
