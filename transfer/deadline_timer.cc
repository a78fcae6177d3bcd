#include "transfer/deadline_timer.h"

#include <utility>

namespace pdr::transfer {

DeadlineTimer::DeadlineTimer(std::function<void(std::uint64_t)> on_expired)
    : on_expired_(std::move(on_expired)), thread_([this] { run(); }) {}

DeadlineTimer::~DeadlineTimer() { shutdown(); }

void DeadlineTimer::shutdown() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  std::lock_guard join_lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

void DeadlineTimer::add(std::uint64_t id, Clock::time_point deadline) {
  bool earliest = false;
  {
    std::lock_guard lock(mu_);
    auto it = by_deadline_.emplace(deadline, id);
    by_id_[id] = it;
    earliest = it == by_deadline_.begin();
  }
  if (earliest) cv_.notify_all();
}

void DeadlineTimer::remove(std::uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return;
  by_deadline_.erase(it->second);
  by_id_.erase(it);
}

void DeadlineTimer::run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    if (by_deadline_.empty()) {
      cv_.wait(lock);
      continue;
    }
    auto first = by_deadline_.begin();
    // A copy: remove() may erase this entry while we wait, and wait_until reads its argument again.
    const Clock::time_point when = first->first;
    if (Clock::now() < when) {
      cv_.wait_until(lock, when);
      continue;
    }
    const std::uint64_t id = first->second;
    by_id_.erase(id);
    by_deadline_.erase(first);
    lock.unlock();
    on_expired_(id);
    lock.lock();
  }
}

}  // namespace pdr::transfer
