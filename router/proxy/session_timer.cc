#include "router/proxy/session_timer.h"

#include <utility>

namespace pdr::router::proxy {

bool SessionTimer::start(uv_loop_s* loop, std::chrono::milliseconds delay, std::function<void()> fn) {
  if (!timer_ && timer_.init(this, [&](uv_timer_t* t) { return uv_timer_init(loop, t); }) != 0) return false;
  fn_ = std::move(fn);
  armed_ = true;
  const auto ms = delay.count() > 0 ? static_cast<uint64_t>(delay.count()) : 0;
  uv_timer_start(timer_.get(), &SessionTimer::on_fire, ms, 0);
  return true;
}

void SessionTimer::stop() {
  armed_ = false;
  fn_ = nullptr;
  if (timer_) uv_timer_stop(timer_.get());
}

void SessionTimer::on_fire(uv_timer_t* t) {
  auto* self = http::detail::UvHandle<uv_timer_t>::owner_of<SessionTimer>(t);
  // A copy: the callback may end the session that owns this timer.
  std::function<void()> fn = std::exchange(self->fn_, nullptr);
  self->armed_ = false;
  if (fn) fn();
}

}  // namespace pdr::router::proxy
