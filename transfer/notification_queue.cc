#include "transfer/notification_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace pdr::transfer {

NotificationQueue::NotificationQueue(std::size_t capacity)
    : capacity_(std::max<std::size_t>(capacity, 1)) {}

NotificationQueue::~NotificationQueue() {
  if (event_fd_ >= 0) ::close(event_fd_);
}

void NotificationQueue::push(std::string_view from, std::string_view message) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= capacity_) {
      queue_.pop_front();
      ++dropped_;
    }
    queue_.push_back(Notification{std::string(from), std::string(message)});
    sync_event_fd();
  }
  cv_.notify_all();
}

std::size_t NotificationQueue::take_all(std::vector<Notification>* out) {
  std::lock_guard lock(mu_);
  const std::size_t n = queue_.size();
  for (Notification& notification : queue_) out->push_back(std::move(notification));
  queue_.clear();
  sync_event_fd();
  return n;
}

bool NotificationQueue::wait_for(std::string_view message,
                                 std::chrono::steady_clock::time_point deadline,
                                 std::string* from) {
  std::unique_lock lock(mu_);
  for (;;) {
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [&](const Notification& n) { return n.message == message; });
    if (it != queue_.end()) {
      if (from != nullptr) *from = std::move(it->from);
      queue_.erase(it);
      sync_event_fd();
      return true;
    }
    if (deadline == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock);
    } else if (std::chrono::steady_clock::now() >= deadline) {
      return false;
    } else {
      cv_.wait_until(lock, deadline);
    }
  }
}

int NotificationQueue::event_fd() {
  std::lock_guard lock(mu_);
  if (event_fd_ < 0) {
    const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) return -errno;
    event_fd_ = fd;
    event_fd_readable_ = false;
    sync_event_fd();
  }
  return event_fd_;
}

std::uint64_t NotificationQueue::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

void NotificationQueue::sync_event_fd() {
  if (event_fd_ < 0) return;
  const bool want = !queue_.empty();
  if (want == event_fd_readable_) return;
  std::uint64_t value = 1;
  // Neither call can block (EFD_NONBLOCK) or fail short of a counter overflow.
  if (want) {
    [[maybe_unused]] ssize_t n = ::write(event_fd_, &value, sizeof value);
  } else {
    [[maybe_unused]] ssize_t n = ::read(event_fd_, &value, sizeof value);
  }
  event_fd_readable_ = want;
}

}  // namespace pdr::transfer
