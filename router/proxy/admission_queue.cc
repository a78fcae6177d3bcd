// The admission queue (contracts in admission_queue.h).
//
// Why the lock-free paths cannot strand a waiter. The slots are `in_flight_`; `waiting_` counts
// the linked waiters. Every access of either that the argument uses is sequentially consistent,
// so all of them fall in one total order.
//   - A taker without the queue (try_take) reads waiting_ == 0, then takes a slot by a
//     compare-and-swap below the limit (take_slot: it never counts past the limit, so a failed
//     try adds nothing another thread could misread as a slot in use).
//   - A taker that found no slot calls enqueue(): under the lock it links itself and adds to
//     waiting_ (I), then tries take_slot again for the head of the queue (T, grant_free_slots).
//   - A releaser that read waiting_ == 0 subtracts its slot (S), then reads waiting_ again (R):
//     non-zero means a waiter came meanwhile, and it takes the lock and grants free slots.
// Either S comes before T in the total order, and T sees the slot S freed (the waiter gets it,
// unless another taker got it first, which is a slot used, not lost); or T comes before S, so
// I < T < S < R and R sees the waiter: the releaser takes the lock, which it gets only after
// the enqueue's critical section (I was under it), and grants the slot to the queue's head.
// A releaser that read waiting_ != 0 takes the lock and hands its slot to the head directly
// (in_flight_ unchanged). So whenever a waiter is linked, every slot is in use or some thread is
// about to grant it under the lock. A taker that read waiting_ == 0 just before a waiter linked
// may still take a slot that just came free ahead of it: it arrived at the same moment.
//
// Nothing allocates under the lock: a waiter brings the index node its tenant's FIFO needs
// (made in its constructor) and carries away the node of a FIFO it emptied; both are freed with
// the waiter, after the lock. Only the index's bucket array may grow under it, once per new
// high-water mark of tenants waiting in a class.
#include "router/proxy/admission_queue.h"

#include <algorithm>
#include <utility>

namespace pdr::router::proxy {

namespace {

uint32_t clamp_priority(uint32_t p) { return p < kPriorityClasses ? p : kPriorityClasses - 1; }

// Tenants waiting at once in one class before its index grows.
constexpr size_t kIndexBuckets = 64;

}  // namespace

bool queue_priority(std::optional<std::string_view> header, uint32_t tenant_priority, bool header_sets_any,
                    uint32_t* out) {
  const uint32_t tenant = clamp_priority(tenant_priority);
  if (!header) {
    *out = tenant;
    return true;
  }
  std::string_view v = *header;
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  static_assert(kPriorityClasses <= 10, "one digit names a class");
  if (v.size() != 1 || v[0] < '0' || static_cast<uint32_t>(v[0] - '0') >= kPriorityClasses) return false;
  const auto asked = static_cast<uint32_t>(v[0] - '0');
  *out = header_sets_any ? asked : std::min(asked, tenant);
  return true;
}

AdmissionQueue::Waiter::Waiter(uint32_t priority, std::string tenant, uint64_t bytes, uint32_t worker)
    : priority_(clamp_priority(priority)), tenant_(std::move(tenant)), bytes_(bytes), worker_(worker) {
  FifoIndex scratch;
  node_ = scratch.extract(scratch.try_emplace(tenant_).first);
}

AdmissionQueue::Waiter::~Waiter() {
  // Granted, and nobody took the slot (its notify never ran: the worker had stopped): it goes
  // back. Not under the queue's lock: the queue drops its reference only after unlocking.
  if (queue_ != nullptr && outcome() == Outcome::kGranted && !grant_taken_) queue_->release();
}

bool AdmissionQueue::Waiter::take_grant() {
  if (outcome() != Outcome::kGranted || grant_taken_) return false;
  grant_taken_ = true;
  return true;
}

AdmissionQueue::AdmissionQueue(std::atomic<int64_t>& in_flight, AdmissionQueueCounters& counters)
    : in_flight_(in_flight), counters_(counters) {
  for (Class& c : classes_) c.index.reserve(kIndexBuckets);
}

AdmissionQueue::~AdmissionQueue() {
  // Waiters still linked (their workers are gone with the server) are let go without a notify.
  Waiter* left = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (Waiter* w = pop_next()) leave(w, Outcome::kWithdrawn, &left);
  }
  while (left != nullptr) {
    Waiter* w = left;
    left = w->next_woken_;
    std::shared_ptr<Waiter> drop = std::move(w->self_);
  }
}

bool AdmissionQueue::take_slot(int64_t limit) {
  int64_t n = in_flight_.load(std::memory_order_seq_cst);
  while (n < limit) {
    if (in_flight_.compare_exchange_weak(n, n + 1, std::memory_order_seq_cst)) return true;
  }
  return false;
}

bool AdmissionQueue::try_take(uint32_t max_concurrent) {
  // Stored only when it changed: one shared cache line not written per request.
  if (max_concurrent_.load(std::memory_order_relaxed) != max_concurrent) {
    max_concurrent_.store(max_concurrent, std::memory_order_relaxed);
  }
  if (waiting_.load(std::memory_order_seq_cst) != 0) return false;
  return take_slot(max_concurrent);
}

bool AdmissionQueue::take_without_queue(uint32_t max_concurrent) {
  if (max_concurrent_.load(std::memory_order_relaxed) != max_concurrent) {
    max_concurrent_.store(max_concurrent, std::memory_order_relaxed);
  }
  return take_slot(max_concurrent);
}

AdmissionQueue::Enqueued AdmissionQueue::enqueue(const std::shared_ptr<Waiter>& waiter, const Limits& limits) {
  Waiter* woken = nullptr;
  Enqueued result = Enqueued::kQueued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    max_concurrent_.store(limits.max_concurrent, std::memory_order_relaxed);
    if (shut_down_) return Enqueued::kShutDown;
    if (limits.max_requests == 0 || waiting_.load(std::memory_order_relaxed) >= limits.max_requests) {
      return Enqueued::kFullRequests;
    }
    if (counters_.bytes.load(std::memory_order_relaxed) + waiter->bytes_ > limits.max_bytes) {
      return Enqueued::kFullBytes;
    }
    Waiter* w = waiter.get();
    Class& k = classes_[w->priority_];
    auto it = k.index.find(std::string_view(w->tenant_));
    if (it == k.index.end()) {
      it = k.index.insert(std::move(w->node_)).position;
      TenantFifo* f = &it->second;
      if (k.cursor == nullptr) {
        f->ring_prev = f->ring_next = f;
        k.cursor = f;
      } else {
        // Last in the round: every tenant already waiting has its turn before it.
        f->ring_next = k.cursor;
        f->ring_prev = k.cursor->ring_prev;
        k.cursor->ring_prev->ring_next = f;
        k.cursor->ring_prev = f;
      }
    }
    TenantFifo* f = &it->second;
    w->fifo_ = f;
    w->prev_ = f->tail;
    w->next_ = nullptr;
    (f->tail != nullptr ? f->tail->next_ : f->head) = w;
    f->tail = w;
    w->queue_ = this;
    w->self_ = waiter;
    counters_.depth[w->priority_].fetch_add(1, std::memory_order_relaxed);
    counters_.bytes.fetch_add(w->bytes_, std::memory_order_relaxed);
    waiting_.fetch_add(1, std::memory_order_seq_cst);  // (I) in the reasoning above
    grant_free_slots(&woken);                          // (T)
    if (w->outcome_.load(std::memory_order_relaxed) == Outcome::kGranted) {
      // A slot came free between the caller's try and here: the caller has it, no notify.
      // (The caller still holds `waiter`: dropping the queue's reference frees nothing here.)
      for (Waiter** p = &woken; *p != nullptr; p = &(*p)->next_woken_) {
        if (*p == w) {
          *p = w->next_woken_;
          break;
        }
      }
      w->next_woken_ = nullptr;
      w->grant_taken_ = true;
      w->self_.reset();
      result = Enqueued::kGranted;
    }
  }
  notify_all(woken);
  return result;
}

AdmissionQueue::Outcome AdmissionQueue::withdraw(Waiter& waiter) {
  std::shared_ptr<Waiter> self;  // the queue's reference, dropped after the lock
  std::lock_guard<std::mutex> lock(mu_);
  const Outcome before = waiter.outcome_.load(std::memory_order_relaxed);
  if (before != Outcome::kWaiting) return before;
  unlink(&waiter);
  waiter.outcome_.store(Outcome::kWithdrawn, std::memory_order_release);
  self = std::move(waiter.self_);
  return Outcome::kWaiting;
}

void AdmissionQueue::release() {
  Waiter* woken = nullptr;
  if (waiting_.load(std::memory_order_seq_cst) == 0) {
    in_flight_.fetch_sub(1, std::memory_order_seq_cst);           // (S)
    if (waiting_.load(std::memory_order_seq_cst) == 0) return;    // (R)
    std::lock_guard<std::mutex> lock(mu_);
    grant_free_slots(&woken);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t limit = max_concurrent_.load(std::memory_order_relaxed);
    Waiter* head = in_flight_.load(std::memory_order_seq_cst) <= limit ? pop_next() : nullptr;
    if (head != nullptr) {
      leave(head, Outcome::kGranted, &woken);  // the slot passes on: in_flight_ unchanged
    } else {
      in_flight_.fetch_sub(1, std::memory_order_seq_cst);  // nobody waits now, or over a lowered limit
    }
    grant_free_slots(&woken);  // a raised limit may have freed more
  }
  notify_all(woken);
}

void AdmissionQueue::shut_down() {
  Waiter* woken = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
    while (Waiter* w = pop_next()) leave(w, Outcome::kShutDown, &woken);
  }
  notify_all(woken);
}

AdmissionQueue::Waiter* AdmissionQueue::pop_next() {
  for (uint32_t c = kPriorityClasses; c-- > 0;) {
    Class& k = classes_[c];
    if (k.cursor == nullptr) continue;
    TenantFifo* f = k.cursor;
    k.cursor = f->ring_next;  // the next tenant's turn (its own again when it is alone)
    return f->head;
  }
  return nullptr;
}

void AdmissionQueue::unlink(Waiter* w) {
  TenantFifo* f = w->fifo_;
  (w->prev_ != nullptr ? w->prev_->next_ : f->head) = w->next_;
  (w->next_ != nullptr ? w->next_->prev_ : f->tail) = w->prev_;
  w->prev_ = w->next_ = nullptr;
  w->fifo_ = nullptr;
  counters_.depth[w->priority_].fetch_sub(1, std::memory_order_relaxed);
  counters_.bytes.fetch_sub(w->bytes_, std::memory_order_relaxed);
  waiting_.fetch_sub(1, std::memory_order_seq_cst);
  if (f->head != nullptr) return;
  Class& k = classes_[w->priority_];
  if (f->ring_next == f) {
    k.cursor = nullptr;
  } else {
    f->ring_prev->ring_next = f->ring_next;
    f->ring_next->ring_prev = f->ring_prev;
    if (k.cursor == f) k.cursor = f->ring_next;
  }
  w->spent_node_ = k.index.extract(k.index.find(std::string_view(w->tenant_)));
}

void AdmissionQueue::leave(Waiter* w, Outcome outcome, Waiter** woken) {
  unlink(w);
  w->outcome_.store(outcome, std::memory_order_release);
  w->next_woken_ = *woken;
  *woken = w;
}

void AdmissionQueue::grant_free_slots(Waiter** woken) {
  const int64_t limit = max_concurrent_.load(std::memory_order_relaxed);
  while (waiting_.load(std::memory_order_seq_cst) != 0 && take_slot(limit)) {
    Waiter* head = pop_next();
    if (head == nullptr) {  // cannot be (waiting_ counts the linked waiters): the slot goes back
      in_flight_.fetch_sub(1, std::memory_order_seq_cst);
      return;
    }
    leave(head, Outcome::kGranted, woken);
  }
}

void AdmissionQueue::notify_all(Waiter* woken) {
  while (woken != nullptr) {
    Waiter* w = woken;
    woken = w->next_woken_;  // before the notify: the waiter may be gone once it is told
    std::shared_ptr<Waiter> self = std::move(w->self_);
    if (notify_) notify_(std::move(self));
  }
}

}  // namespace pdr::router::proxy
