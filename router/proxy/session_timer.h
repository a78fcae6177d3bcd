// SessionTimer: one restartable one-shot timer on a worker loop, for the deadlines a
// ProxySession keeps itself (client write stall, whole prefill leg, orphaned prefill, whole
// request, decode head held back).
//
// Worker thread only. The callback never runs after stop(), after a later start() replaced it,
// or once the timer is destroyed (the libuv handle is closed then; its memory is freed by libuv's
// close callback). The callback may destroy the timer's owner: it runs from a copy, so the
// owner's members are not touched after it returns. Not movable once started (libuv keeps a
// pointer to it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include "http/uv_handle.h"

struct uv_loop_s;

namespace pdr::router::proxy {

class SessionTimer {
 public:
  SessionTimer() = default;
  SessionTimer(const SessionTimer&) = delete;
  SessionTimer& operator=(const SessionTimer&) = delete;

  // Runs `fn` once after `delay` (0 ms: on the next loop iteration), replacing any pending
  // callback. Returns false (and never calls) if the loop refused a new timer handle.
  bool start(uv_loop_s* loop, std::chrono::milliseconds delay, std::function<void()> fn);
  void stop();
  bool armed() const { return armed_; }

 private:
  static void on_fire(uv_timer_t* t);

  http::detail::UvHandle<uv_timer_t> timer_;
  std::function<void()> fn_;
  bool armed_ = false;
};

}  // namespace pdr::router::proxy
