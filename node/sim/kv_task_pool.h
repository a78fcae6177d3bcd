// KvTaskPool: a fixed set of threads running queued tasks in order of submission, for the KV
// mover's blocking work (side-channel calls and transfer waits, each bounded by its own deadline).
// stop() runs every task still queued, then joins; post() after stop() runs nothing and returns
// false. Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pdr::node::sim {

class KvTaskPool {
 public:
  explicit KvTaskPool(unsigned threads);
  ~KvTaskPool() { stop(); }
  KvTaskPool(const KvTaskPool&) = delete;
  KvTaskPool& operator=(const KvTaskPool&) = delete;

  bool post(std::function<void()> task);
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace pdr::node::sim
