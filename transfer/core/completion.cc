#include "transfer/core/completion.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

namespace pdr::transfer {

namespace {
void signal_eventfd(int fd) {
  const std::uint64_t one = 1;
  // Cannot block or fail short of a counter overflow (2^64 - 1 writes); rearm() drains it.
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}
}  // namespace

Completion::~Completion() {
  // complete() may still be between publishing the state and releasing mu_ on another thread; the
  // owner is allowed to destroy us as soon as it sees the final state, so wait for the lock.
  std::lock_guard lock(mu_);
  if (event_fd_ >= 0) ::close(event_fd_);
}

XferResult Completion::poll() const {
  if (state_.load(std::memory_order_acquire) == XferState::kPending) return XferResult{};
  return result_;
}

XferResult Completion::wait_until(Clock::time_point deadline) const {
  if (state_.load(std::memory_order_acquire) != XferState::kPending) return result_;
  std::unique_lock lock(mu_);
  auto final = [this] { return state_.load(std::memory_order_relaxed) != XferState::kPending; };
  // No deadline: wait without one rather than trust every libc with a timespec near the limit.
  if (deadline == Clock::time_point::max()) {
    cv_.wait(lock, final);
  } else {
    cv_.wait_until(lock, deadline, final);
  }
  return poll();
}

int Completion::event_fd() {
  std::lock_guard lock(mu_);
  if (event_fd_ < 0) {
    const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return -errno;
    event_fd_ = fd;
    if (state_.load(std::memory_order_relaxed) != XferState::kPending) signal_eventfd(event_fd_);
  }
  return event_fd_;
}

bool Completion::set_callback(Callback callback, void* context) {
  {
    std::lock_guard lock(mu_);
    if (callback_taken_ || callback == nullptr) return false;
    callback_taken_ = true;
    if (state_.load(std::memory_order_relaxed) == XferState::kPending) {
      callback_ = callback;
      callback_context_ = context;
      return true;
    }
  }
  // Already final: complete() has run and will not fire it, so we do, outside the lock.
  callback(context, result_);
  return true;
}

void Completion::rearm() {
  std::lock_guard lock(mu_);
  result_ = XferResult{};
  callback_ = nullptr;
  callback_context_ = nullptr;
  callback_taken_ = false;
  if (event_fd_ >= 0) {
    std::uint64_t drained = 0;
    [[maybe_unused]] ssize_t n = ::read(event_fd_, &drained, sizeof drained);  // EAGAIN if unset
  }
  state_.store(XferState::kPending, std::memory_order_release);
}

bool Completion::complete(const XferResult& result) {
  if (result.state == XferState::kPending) return false;
  Callback callback = nullptr;
  void* context = nullptr;
  XferResult published;
  {
    std::lock_guard lock(mu_);
    if (state_.load(std::memory_order_relaxed) != XferState::kPending) return false;
    result_ = result;
    published = result_;
    state_.store(result.state, std::memory_order_release);
    if (event_fd_ >= 0) signal_eventfd(event_fd_);
    callback = callback_;
    context = callback_context_;
    callback_ = nullptr;
    // Notify under the lock: a waiter that wakes may destroy *this as soon as we release mu_.
    cv_.notify_all();
  }
  // From here on, only locals: the owner may already have destroyed *this.
  if (callback != nullptr) callback(context, published);
  return true;
}

}  // namespace pdr::transfer
