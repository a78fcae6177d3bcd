// EtcdOpQueue: the etcd operations a mirror (router/conversation_mirror.h,
// router/session_mirror.h) hands to the registry replicator's thread, in a bounded FIFO.
//
// Request threads push(); the replicator's thread pop()s (and drop_all()s when etcd is gone for
// good). Beyond kMaxQueued an operation is refused and the caller counts it: a request never
// waits for etcd. `wake` (the replicator's wake handle) is called after each push, under the
// lock, so that close() returning means no wake is under way: the replicator closes its wake
// handle after closing the queue. After close(), pushes are dropped silently (shutting down).
//
// Threads: every method from any thread; one mutex, held for a few moves.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "discovery/sources/etcd/conversation_feed.h"

namespace pdr::router {

class EtcdOpQueue {
 public:
  using Op = discovery::sources::etcd::ConversationOp;
  static constexpr size_t kMaxQueued = 4096;

  explicit EtcdOpQueue(std::function<void()> wake) : wake_(std::move(wake)) {}

  // False when the queue is full (the operation is dropped; the caller counts it). True when
  // queued, or dropped because the queue is closed.
  bool push(Op op);
  void close();
  // Up to `max` operations, oldest first.
  std::vector<Op> pop(size_t max);
  // Empties the queue; returns how many operations were dropped.
  size_t drop_all();

 private:
  std::function<void()> wake_;
  std::mutex mu_;
  std::deque<Op> queue_;
  bool closed_ = false;
};

}  // namespace pdr::router
