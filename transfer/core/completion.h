// Completion: how the initiator learns that one transfer finished. Any mix of
//   poll()        - non-blocking, lock-free read of the state;
//   wait_until()  - block until final or a deadline;
//   event_fd()    - an eventfd that turns readable when final, for the caller's epoll/libuv loop;
//   set_callback()- a function run exactly once with the final result.
// (docs/design/kv-transfer.md, Engine API, "Completion".)
//
// Threads and ownership:
// - The backend calls complete() exactly once per arm, from any thread (normally a lane's I/O
//   thread); later calls return false and change nothing. It must not touch the object afterwards.
// - The owner may call poll/wait_until/event_fd/set_callback from any threads, concurrently.
// - The callback runs on the thread that calls complete(), after the result is visible to poll(),
//   outside any internal lock; or, when set_callback() comes after completion, on the caller's
//   thread before set_callback() returns. It must not block (it holds up an I/O thread).
// - The owner may destroy the object once it has seen a final state by any means, even while
//   complete() is still returning on another thread (the destructor waits for it).
// - rearm() resets to kPending for reuse (e.g. a reusable transfer plan); it must not race any
//   other call, and the backend must not hold on to the previous arm.
//
// Linux-only (eventfd). The eventfd is created lazily by the first event_fd() call, so transfers
// nobody epolls cost no file descriptor.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "transfer/core/xfer_types.h"

namespace pdr::transfer {

class Completion {
 public:
  // A plain function and context rather than std::function: no allocation per transfer, and it
  // maps directly onto the planned C ABI.
  using Callback = void (*)(void* context, const XferResult& result);
  using Clock = std::chrono::steady_clock;

  Completion() = default;
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  ~Completion();

  // ---- owner side ----

  // The result so far: state kPending until complete() ran. Lock-free, never blocks.
  XferResult poll() const;

  // Blocks until final or until `deadline`; returns poll()'s value at that point (kPending on
  // timeout). A deadline in the past is a poll.
  XferResult wait_until(Clock::time_point deadline) const;
  XferResult wait_for(Clock::duration timeout) const { return wait_until(Clock::now() + timeout); }
  XferResult wait() const { return wait_until(Clock::time_point::max()); }

  // A non-blocking, close-on-exec eventfd, readable once the transfer is final (it stays readable;
  // read it or not, as you like). Owned by the Completion: do not close it. Returns -errno if the
  // eventfd cannot be created.
  int event_fd();

  // Registers the callback (at most one per arm). Returns false, and registers nothing, if one is
  // already registered for this arm. If the transfer is already final, runs it now.
  bool set_callback(Callback callback, void* context);

  void rearm();

  // ---- backend side ----

  // Publishes the final result (result.state must not be kPending: that returns false). Returns
  // true for the call that completed this arm, false for any later one.
  bool complete(const XferResult& result);

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  // Written once per arm under mu_, before the release store of state_; read by poll() after an
  // acquire load that saw a final state, so it needs no lock.
  XferResult result_;
  std::atomic<XferState> state_{XferState::kPending};
  Callback callback_ = nullptr;  // guarded by mu_
  void* callback_context_ = nullptr;
  bool callback_taken_ = false;  // a callback was registered this arm (fired or pending)
  int event_fd_ = -1;            // guarded by mu_
};

}  // namespace pdr::transfer
