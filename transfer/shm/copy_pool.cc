#include "transfer/shm/copy_pool.h"

#include <algorithm>

namespace pdr::transfer::shm {

CopyPool::CopyPool(unsigned threads) {
  threads = std::max(threads, 1u);
  count_ = threads;
  workers_.reserve(threads);
  for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { run_worker(); });
}

CopyPool::~CopyPool() { stop(); }

bool CopyPool::post(std::function<void()> job) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    jobs_.push_back(std::move(job));
  }
  work_cv_.notify_one();
  return true;
}

void CopyPool::parallel(unsigned parts, const std::function<void(unsigned)>& fn) {
  if (parts <= 1) {
    if (parts == 1) fn(0);
    return;
  }
  std::vector<std::shared_ptr<Piece>> mine;
  {
    std::lock_guard lock(mu_);
    for (unsigned i = 1; i < parts; ++i) {
      auto piece = std::make_shared<Piece>();
      piece->fn = &fn;
      piece->index = i;
      pieces_.push_back(piece);
      mine.push_back(std::move(piece));
    }
  }
  work_cv_.notify_all();
  fn(0);
  for (auto& piece : mine) {
    std::unique_lock lock(mu_);
    if (!piece->taken) {
      // Nobody was free: run it here rather than wait.
      piece->taken = true;
      pieces_.erase(std::find(pieces_.begin(), pieces_.end(), piece));
      lock.unlock();
      fn(piece->index);
      continue;
    }
    piece_cv_.wait(lock, [&] { return piece->done; });
  }
}

void CopyPool::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
}

void CopyPool::run_worker() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty() || !pieces_.empty(); });
    if (!pieces_.empty()) {
      std::shared_ptr<Piece> piece = std::move(pieces_.front());
      pieces_.pop_front();
      piece->taken = true;
      lock.unlock();
      (*piece->fn)(piece->index);
      lock.lock();
      piece->done = true;
      piece_cv_.notify_all();
      continue;
    }
    if (!jobs_.empty()) {
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
      continue;
    }
    if (stopping_) return;
  }
}

}  // namespace pdr::transfer::shm
