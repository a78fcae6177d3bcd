// CopyPool: the shm backend's copy worker threads. Jobs (one transfer each) run in FIFO order on
// whichever worker is free, so submit() never waits for a memcpy; a job may split one large copy
// across the pool with parallel(). Knows nothing about transfers.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pdr::transfer::shm {

class CopyPool {
 public:
  // `threads` >= 1 workers, started now.
  explicit CopyPool(unsigned threads);
  CopyPool(const CopyPool&) = delete;
  CopyPool& operator=(const CopyPool&) = delete;
  ~CopyPool();  // stop()

  unsigned threads() const { return count_; }

  // Queues a job. Returns false (job not queued) once stop() began.
  bool post(std::function<void()> job);

  // From inside a job: runs fn(0) .. fn(parts - 1), part 0 on the calling worker and the others on
  // idle workers, and returns when all have returned. A part no other worker picked up in time runs
  // on the caller, so this never deadlocks, even with one thread.
  void parallel(unsigned parts, const std::function<void(unsigned)>& fn);

  // Runs every job already queued, then joins the workers. Idempotent.
  void stop();

 private:
  struct Piece {
    const std::function<void(unsigned)>* fn = nullptr;
    unsigned index = 0;
    bool taken = false;
    bool done = false;
  };
  void run_worker();

  std::mutex mu_;
  std::condition_variable work_cv_;   // jobs or pieces queued, or stopping
  std::condition_variable piece_cv_;  // a piece finished
  std::deque<std::function<void()>> jobs_;
  std::deque<std::shared_ptr<Piece>> pieces_;  // preferred over jobs: a job is waiting for them
  bool stopping_ = false;
  unsigned count_ = 1;
  std::vector<std::thread> workers_;
};

}  // namespace pdr::transfer::shm
