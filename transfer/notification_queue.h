// NotificationQueue: the notifications peers sent this engine, waiting for the application.
// Backends push() from their I/O threads; the application takes them all, waits for one by message
// (a decode waiting for "its" transfer id), or epolls an eventfd that is readable exactly while the
// queue is non-empty. Bounded: beyond `capacity` the oldest entry is dropped and counted, so a peer
// flooding notifications cannot grow memory without limit.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace pdr::transfer {

struct Notification {
  std::string from;  // the sending agent
  std::string message;
};

class NotificationQueue {
 public:
  explicit NotificationQueue(std::size_t capacity);
  NotificationQueue(const NotificationQueue&) = delete;
  NotificationQueue& operator=(const NotificationQueue&) = delete;
  ~NotificationQueue();

  void push(std::string_view from, std::string_view message);
  std::size_t take_all(std::vector<Notification>* out);
  // Consumes the oldest notification whose message equals `message`; false at the deadline.
  bool wait_for(std::string_view message, std::chrono::steady_clock::time_point deadline,
                std::string* from);
  // Created on first use; -errno when eventfd() fails.
  int event_fd();
  std::uint64_t dropped() const;

 private:
  // Keeps the eventfd readable iff the queue is non-empty. Caller holds mu_.
  void sync_event_fd();

  const std::size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Notification> queue_;
  std::uint64_t dropped_ = 0;
  int event_fd_ = -1;
  bool event_fd_readable_ = false;
};

}  // namespace pdr::transfer
