// WriterFirstSharedMutex: a reader-writer lock under which a waiting writer goes before readers
// that arrive after it (glibc's PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP). Meets the
// SharedMutex requirements, so std::unique_lock and std::shared_lock work with it.
//
// Why not std::shared_mutex: on glibc it prefers readers, so readers that keep the lock shared
// back to back (many threads looking up at a high rate) can keep a writer out for as long as they
// go on. With writer preference a reader waits at most for the readers already inside plus one
// writer's hold, and a writer that takes the lock in short slices still makes progress.
// Non-recursive: a thread must not take the shared lock twice (with a writer waiting between the
// two, it would wait for itself).
#pragma once

#include <pthread.h>

#include <cstdlib>

namespace pdr {

class WriterFirstSharedMutex {
 public:
  WriterFirstSharedMutex() {
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    if (pthread_rwlock_init(&rw_, &attr) != 0) std::abort();
    pthread_rwlockattr_destroy(&attr);
  }
  ~WriterFirstSharedMutex() { pthread_rwlock_destroy(&rw_); }
  WriterFirstSharedMutex(const WriterFirstSharedMutex&) = delete;
  WriterFirstSharedMutex& operator=(const WriterFirstSharedMutex&) = delete;

  // Failures here are misuse (deadlock on a held lock, unlocking one not held): abort.
  void lock() { check(pthread_rwlock_wrlock(&rw_)); }
  bool try_lock() { return pthread_rwlock_trywrlock(&rw_) == 0; }
  void unlock() { check(pthread_rwlock_unlock(&rw_)); }
  void lock_shared() { check(pthread_rwlock_rdlock(&rw_)); }
  bool try_lock_shared() { return pthread_rwlock_tryrdlock(&rw_) == 0; }
  void unlock_shared() { check(pthread_rwlock_unlock(&rw_)); }

 private:
  static void check(int rc) {
    if (rc != 0) std::abort();
  }
  pthread_rwlock_t rw_;
};

}  // namespace pdr
