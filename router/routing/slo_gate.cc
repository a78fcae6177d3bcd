#include "router/routing/slo_gate.h"

namespace pdr::router::routing {

uint64_t SloGate::park(uint32_t worker, std::function<void()> recheck) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t ticket = next_ticket_++;
  waiting_.push_back({ticket, worker, std::move(recheck)});
  parked_.store(waiting_.size(), std::memory_order_relaxed);
  return ticket;
}

bool SloGate::withdraw(uint64_t ticket) {
  std::function<void()> dropped;  // destroyed after the lock: it may hold the last session reference
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i].ticket != ticket) continue;
    dropped = std::move(waiting_[i].recheck);
    waiting_[i] = std::move(waiting_.back());
    waiting_.pop_back();
    parked_.store(waiting_.size(), std::memory_order_relaxed);
    return true;
  }
  return false;
}

void SloGate::drop_all() {
  std::vector<Parked> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped.swap(waiting_);
    parked_.store(0, std::memory_order_relaxed);
  }
}

void SloGate::wake() {
  // The common case, nobody waiting, costs one load on the leg's path.
  if (parked_.load(std::memory_order_relaxed) == 0) return;
  std::vector<Parked> woken;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    woken.swap(waiting_);
    parked_.store(0, std::memory_order_relaxed);
  }
  rechecks_.fetch_add(woken.size(), std::memory_order_relaxed);
  for (Parked& p : woken) {
    if (post_) {
      post_(p.worker, std::move(p.recheck));
    } else {
      p.recheck();
    }
  }
}

}  // namespace pdr::router::routing
