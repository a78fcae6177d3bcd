#include "router/routing/timer_queue.h"

#include <uv.h>

#include <functional>
#include <utility>

#include "router/routing/session_timer.h"

namespace pdr::router::routing {

TimerQueue::TimerQueue(uv_loop_s* loop) : loop_(loop) {
  // A failed init leaves the queue unusable: SessionTimer::start() then answers false.
  (void)timer_.init(this, [&](uv_timer_t* t) { return uv_timer_init(loop, t); });
  heap_.reserve(64);
}

TimerQueue::~TimerQueue() {
  for (SessionTimer* t : heap_) {
    t->queue_ = nullptr;
    t->index_ = kUnlinked;
    t->fn_ = nullptr;
  }
  heap_.clear();
  timer_.close();
}

uint64_t TimerQueue::now() const { return uv_now(loop_); }

bool TimerQueue::earlier(const SessionTimer* a, const SessionTimer* b) {
  return a->due_ < b->due_ || (a->due_ == b->due_ && a->seq_ < b->seq_);
}

void TimerQueue::place(size_t i, SessionTimer* t) {
  heap_[i] = t;
  t->index_ = i;
}

void TimerQueue::sift_up(size_t i) {
  SessionTimer* t = heap_[i];
  while (i > 0) {
    const size_t parent = (i - 1) / 2;
    if (!earlier(t, heap_[parent])) break;
    place(i, heap_[parent]);
    i = parent;
  }
  place(i, t);
}

void TimerQueue::sift_down(size_t i) {
  SessionTimer* t = heap_[i];
  const size_t n = heap_.size();
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= n) break;
    if (child + 1 < n && earlier(heap_[child + 1], heap_[child])) ++child;
    if (!earlier(heap_[child], t)) break;
    place(i, heap_[child]);
    i = child;
  }
  place(i, t);
}

void TimerQueue::link(SessionTimer* t) {
  t->queue_ = this;
  heap_.push_back(t);
  sift_up(heap_.size() - 1);
  if (t->due_ < armed_due_) arm(t->due_);
}

void TimerQueue::unlink(SessionTimer* t) {
  const size_t i = t->index_;
  t->queue_ = nullptr;
  t->index_ = kUnlinked;
  SessionTimer* last = heap_.back();
  heap_.pop_back();
  if (last != t) {
    place(i, last);
    sift_up(i);
    sift_down(last->index_);
  }
  if (heap_.empty() && armed_due_ != kNotArmed) {
    // Nothing left to wait for: an armed timer would keep the loop alive for nothing.
    uv_timer_stop(timer_.get());
    armed_due_ = kNotArmed;
  }
  // Otherwise the libuv timer stays armed for a due time at or before the earliest deadline left;
  // if it fires early, on_fire re-arms for what is left.
}

void TimerQueue::arm(uint64_t due) {
  const uint64_t now_ms = now();
  uv_timer_start(timer_.get(), &TimerQueue::on_fire, due > now_ms ? due - now_ms : 0, 0);
  armed_due_ = due;
}

void TimerQueue::on_fire(uv_timer_t* handle) {
  auto* self = http::detail::UvHandle<uv_timer_t>::owner_of<TimerQueue>(handle);
  self->armed_due_ = kNotArmed;  // a one-shot libuv timer is stopped once it fired
  const uint64_t now_ms = self->now();
  // As libuv's own timer pass: every deadline at or before the loop time, earliest first; one
  // started (delay 0) by a callback here is due now and runs in this pass too. A callback may
  // stop or destroy other timers (they leave the heap) or destroy the queue's owner's sessions,
  // but not the queue itself (the worker's, destroyed only with its WorkerContext).
  while (!self->heap_.empty() && self->heap_.front()->due_ <= now_ms) {
    SessionTimer* t = self->heap_.front();
    std::function<void()> fn = std::move(t->fn_);
    t->fn_ = nullptr;
    self->unlink(t);
    if (fn) fn();  // may destroy `t`'s owner: `t` is not touched after this
  }
  if (!self->heap_.empty() && self->armed_due_ == kNotArmed) self->arm(self->heap_.front()->due_);
}

}  // namespace pdr::router::routing
