// SessionTimer: one restartable one-shot timer on a worker loop, for the deadlines a
// ProxySession keeps itself (client write stall, whole prefill leg, orphaned prefill, whole
// request, decode head held back). Its deadline lives in the worker's TimerQueue (timer_queue.h:
// one libuv timer per loop, deadlines in a heap), so a start or stop allocates nothing and makes
// no libuv handle.
//
// Worker thread only. The callback never runs after stop(), after a later start() replaced it,
// or once the timer (or its queue) is destroyed: destroying a linked timer unlinks it. The
// callback may destroy the timer's owner: the timer is unlinked and its callback moved out before
// it runs, so the owner's members are not touched after it returns. Not movable (the queue keeps a
// pointer to it while it is armed).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "router/routing/timer_queue.h"

namespace pdr::router::routing {

class SessionTimer {
 public:
  SessionTimer() = default;
  ~SessionTimer() { stop(); }
  SessionTimer(const SessionTimer&) = delete;
  SessionTimer& operator=(const SessionTimer&) = delete;

  // Runs `fn` once after `delay` (0 ms: in the loop's next timer pass) of `queue`'s loop time,
  // replacing any pending callback. Returns false (and never calls) if the queue has no libuv
  // timer (the loop refused it).
  bool start(TimerQueue& queue, std::chrono::milliseconds delay, std::function<void()> fn);
  void stop();
  bool armed() const { return queue_ != nullptr; }

 private:
  friend class TimerQueue;

  TimerQueue* queue_ = nullptr;  // non-null while linked (armed)
  size_t index_ = TimerQueue::kUnlinked;  // position in queue_'s heap
  uint64_t due_ = 0;                      // loop time (ms) it fires at
  uint64_t seq_ = 0;                      // start order within the queue
  std::function<void()> fn_;
};

}  // namespace pdr::router::routing
