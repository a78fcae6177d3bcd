#include "router/routing/session_timer.h"

#include <utility>

namespace pdr::router::routing {

bool SessionTimer::start(TimerQueue& queue, std::chrono::milliseconds delay, std::function<void()> fn) {
  stop();
  if (!queue.usable()) return false;
  fn_ = std::move(fn);
  const uint64_t ms = delay.count() > 0 ? static_cast<uint64_t>(delay.count()) : 0;
  due_ = queue.now() + ms;  // what uv_timer_start computes: the loop's cached time plus the delay
  seq_ = queue.next_seq_++;
  queue.link(this);
  return true;
}

void SessionTimer::stop() {
  fn_ = nullptr;
  if (queue_ != nullptr) queue_->unlink(this);
}

}  // namespace pdr::router::routing
