// TimerQueue: the deadlines of one worker loop's SessionTimers, kept in one binary min-heap and
// served by one libuv timer, so that starting and stopping a session's deadline (one or two per
// request) costs a heap insert or removal (O(log n), no allocation once the heap has grown) instead
// of a libuv handle allocated, started, stopped and closed per session.
//
// Semantics are libuv's own timers': a timer started with delay d at loop time t fires in the first
// timer pass at or after t + d (uv_now); timers due in one pass fire in order of due time, then of
// start; a timer started with delay 0 inside a callback of that pass fires in the same pass, as
// libuv 1.44's would. The libuv timer is lazy: it is re-armed only when a new deadline is earlier
// than the one it waits for; when it fires before the earliest deadline (that one was stopped) it
// re-arms for what is left; it is stopped when no deadline is left (so an idle queue keeps no loop
// alive).
//
// Worker thread only. Owned by the loop's WorkerContext (or a test); destroy it before the loop is
// closed (its handle's close then completes on the loop's next run). Timers still linked when it
// is destroyed are unlinked and never fire.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "router/http/uv_handle.h"

struct uv_loop_s;

namespace pdr::router::routing {

class SessionTimer;

class TimerQueue {
 public:
  explicit TimerQueue(uv_loop_s* loop);
  ~TimerQueue();
  TimerQueue(const TimerQueue&) = delete;
  TimerQueue& operator=(const TimerQueue&) = delete;

  uv_loop_s* loop() const { return loop_; }
  // Deadlines linked now.
  size_t size() const { return heap_.size(); }

 private:
  friend class SessionTimer;
  static constexpr size_t kUnlinked = SIZE_MAX;
  static constexpr uint64_t kNotArmed = UINT64_MAX;

  // False when the loop refused the timer handle (at construction).
  bool usable() const { return static_cast<bool>(timer_); }
  // `t` (unlinked, its due_ set) joins the heap; the libuv timer is re-armed if it is the earliest.
  void link(SessionTimer* t);
  // `t` (linked) leaves the heap; the libuv timer stops when the heap is empty.
  void unlink(SessionTimer* t);
  uint64_t now() const;

  static bool earlier(const SessionTimer* a, const SessionTimer* b);
  void place(size_t i, SessionTimer* t);
  void sift_up(size_t i);
  void sift_down(size_t i);
  void arm(uint64_t due);
  static void on_fire(uv_timer_t* handle);

  uv_loop_s* loop_;
  http::detail::UvHandle<uv_timer_t> timer_;
  std::vector<SessionTimer*> heap_;
  uint64_t armed_due_ = kNotArmed;  // loop time the libuv timer fires at; kNotArmed: stopped
  uint64_t next_seq_ = 0;           // start order, for deadlines due at the same time
};

}  // namespace pdr::router::routing
