// SnapshotCell<T>: one writer publishes immutable values; many readers on other threads see the
// newest one without contending on the hot path.
//
// Publishing swaps the shared_ptr under a mutex and then bumps `version_` (release). A reader keeps
// its own cached shared_ptr (SnapshotReader) and compares one atomic integer per access (acquire);
// only when the version moved does it take the mutex, for the few nanoseconds of a pointer copy.
// Readers therefore never lock on the steady-state path, and a reader holding an old snapshot
// keeps it alive for as long as it needs it. (A plain mutex rather than
// std::atomic<std::shared_ptr>: libstdc++ 12 implements the latter with a lock bit that
// ThreadSanitizer cannot see, and it locks internally anyway.)
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

namespace pdr {

template <typename T>
class SnapshotCell {
 public:
  explicit SnapshotCell(std::shared_ptr<const T> initial = std::make_shared<const T>())
      : value_(std::move(initial)) {}
  SnapshotCell(const SnapshotCell&) = delete;
  SnapshotCell& operator=(const SnapshotCell&) = delete;

  // Any thread; normally a single writer. The old value is released outside the lock.
  void publish(std::shared_ptr<const T> next) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      value_.swap(next);
    }
    version_.fetch_add(1, std::memory_order_release);
  }
  // Any thread. Takes the mutex briefly; prefer one SnapshotReader per thread.
  std::shared_ptr<const T> load() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return value_;
  }
  uint64_t version() const { return version_.load(std::memory_order_acquire); }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const T> value_;
  std::atomic<uint64_t> version_{0};
};

// Per-thread cache over a SnapshotCell. Not thread-safe itself: one reader object per thread.
template <typename T>
class SnapshotReader {
 public:
  explicit SnapshotReader(const SnapshotCell<T>& cell) : cell_(&cell) { refresh(); }

  // Newest published value; the reference is valid until the next call on this reader.
  const std::shared_ptr<const T>& get() {
    if (cell_->version() != seen_version_) refresh();
    return cached_;
  }

 private:
  void refresh() {
    // Read the version first: if a publish races, we may fetch a newer value than the version says,
    // and the next get() refreshes once more. Never the reverse (an old value marked as new).
    seen_version_ = cell_->version();
    cached_ = cell_->load();
  }
  const SnapshotCell<T>* cell_;
  uint64_t seen_version_ = 0;
  std::shared_ptr<const T> cached_;
};

}  // namespace pdr
