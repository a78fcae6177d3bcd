// DeadlineTimer: one thread that fires a callback with a transfer id when its deadline passes
// (the engine turns that into a cancel with cause kTimeout). Transfers without a deadline never
// enter it. add/remove are O(log n) under a mutex; the thread sleeps until the earliest deadline.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace pdr::transfer {

class DeadlineTimer {
 public:
  using Clock = std::chrono::steady_clock;
  // `on_expired` runs on the timer thread, without the timer's lock held.
  explicit DeadlineTimer(std::function<void(std::uint64_t id)> on_expired);
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;
  ~DeadlineTimer();  // shutdown()

  // Joins the thread; pending and later deadlines never fire. Idempotent; add/remove stay safe.
  void shutdown();

  void add(std::uint64_t id, Clock::time_point deadline);
  void remove(std::uint64_t id);  // no-op for an unknown or already fired id

 private:
  void run();

  std::function<void(std::uint64_t)> on_expired_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, std::uint64_t> by_deadline_;
  std::unordered_map<std::uint64_t, std::multimap<Clock::time_point, std::uint64_t>::iterator>
      by_id_;
  bool stopping_ = false;
  std::mutex join_mu_;  // shutdown() from several threads joins once
  std::thread thread_;  // last: starts after every member above exists
};

}  // namespace pdr::transfer
