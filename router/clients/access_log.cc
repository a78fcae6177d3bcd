// The access log's queue and writer thread (contracts in access_log.h).
#include "router/clients/access_log.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "proto/base/log.h"
#include "proto/base/metrics_writer.h"

namespace pdr::router::clients {

namespace {

// Standard error is shared with pdrouter's own log (and its file description with whoever
// started pdrouter), so it is never switched to non-blocking: the writer waits for POLLOUT and
// writes at most PIPE_BUF bytes at a time, which a pipe that polled writable always takes whole.
constexpr size_t kSharedFdChunk = PIPE_BUF;

}  // namespace

AccessLog::AccessLog() { wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

AccessLog::~AccessLog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stop_deadline_ = std::chrono::steady_clock::now() + kStopFlush;
  }
  wake_.notify_one();
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  close_output();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void AccessLog::configure(const std::string& path, size_t max_queued_lines) {
  bool start = false;
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    max_queued_ = max_queued_lines;
    if (path != path_) {
      path_ = path;
      changed = true;
      if (path.empty()) {
        dropped_.fetch_add(queue_.size(), std::memory_order_relaxed);
        queue_.clear();
      }
    }
    start = !path.empty() && !thread_.joinable();
    if (start) thread_ = std::thread([this] { run(); });
  }
  enabled_.store(!path.empty(), std::memory_order_relaxed);
  if (changed) {
    if (!path.empty()) pdr::log::info("access log: writing to {}", path);
    reopen();
  }
}

void AccessLog::reopen() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    reopen_ = true;
  }
  wake_.notify_one();
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }
}

void AccessLog::log(AccessRecord&& record) {
  bool wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (path_.empty() || queue_.size() >= max_queued_) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue_.push_back(std::move(record));
    // The first line of a batch wakes an idle writer, which then gathers lines for
    // kFlushInterval; half a queue cuts that short. Otherwise nobody is woken: at most a couple of
    // wake-ups per batch, not one per request.
    wake = queue_.size() == 1 || queue_.size() == max_queued_ / 2;
  }
  if (wake) wake_.notify_one();
}

void AccessLog::run() {
  std::vector<AccessRecord> batch;
  std::string buffer;
  for (;;) {
    std::string path;
    bool reopen = false, stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle until a line comes; then the lines of the next kFlushInterval (or half a queue) go
      // together.
      wake_.wait(lock, [&] { return stop_ || reopen_ || !queue_.empty(); });
      wake_.wait_for(lock, kFlushInterval, [&] { return stop_ || reopen_ || queue_.size() >= max_queued_ / 2; });
      // An output that could not be opened (a FIFO without a reader) is tried again after its
      // back-off (ensure_open); the lines that waited for it are dropped if it still fails.
      if (fd_ < 0 && !stop_ && !reopen_ && std::chrono::steady_clock::now() < retry_open_at_) {
        wake_.wait_until(lock, retry_open_at_, [&] { return stop_ || reopen_; });
      }
      batch.swap(queue_);
      path = path_;
      reopen = std::exchange(reopen_, false);
      stopping = stop_;
    }
    if (reopen || path != open_path_) {
      close_output();
      retry_open_at_ = {};
    }
    if (!batch.empty()) {
      if (ensure_open(path)) {
        buffer.clear();
        for (const AccessRecord& record : batch) append_access_line(record, &buffer);
        if (write_all(buffer)) {
          lines_.fetch_add(batch.size(), std::memory_order_relaxed);
        } else {
          dropped_.fetch_add(batch.size(), std::memory_order_relaxed);
        }
      } else {
        dropped_.fetch_add(batch.size(), std::memory_order_relaxed);
      }
      batch.clear();
      if (buffer.capacity() > (1u << 20)) std::string().swap(buffer);  // a burst's buffer is not kept
    }
    if (stopping) {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty() || std::chrono::steady_clock::now() >= stop_deadline_) {
        dropped_.fetch_add(queue_.size(), std::memory_order_relaxed);
        queue_.clear();
        return;
      }
    }
  }
}

bool AccessLog::ensure_open(const std::string& path) {
  if (fd_ >= 0) return true;
  if (path.empty()) return false;
  const auto now = std::chrono::steady_clock::now();
  if (now < retry_open_at_) return false;
  open_path_ = path;
  if (path == "stderr") {
    fd_ = STDERR_FILENO;
    own_fd_ = false;
  } else {
    // O_NONBLOCK: a FIFO without a reader fails at once (ENXIO) rather than blocking the open.
    fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY, 0640);
    if (fd_ < 0) {
      const int err = errno;
      errors_.fetch_add(1, std::memory_order_relaxed);
      if (retry_open_at_ == std::chrono::steady_clock::time_point{}) {
        pdr::log::warn("access log: cannot open {}: {}; lines are dropped until it opens (retried every {} ms)", path,
                       std::strerror(err), kReopenRetry.count());
      }
      retry_open_at_ = now + kReopenRetry;
      return false;
    }
    own_fd_ = true;
    if (retry_open_at_ != std::chrono::steady_clock::time_point{}) pdr::log::info("access log: {} opened", path);
  }
  retry_open_at_ = {};
  return true;
}

void AccessLog::close_output() {
  if (fd_ >= 0 && own_fd_) ::close(fd_);
  fd_ = -1;
  own_fd_ = false;
}

bool AccessLog::write_all(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t n = own_fd_ ? bytes.size() : std::min(bytes.size(), kSharedFdChunk);
    ssize_t written = -1;
    if (own_fd_) written = ::write(fd_, bytes.data(), n);
    if (written > 0) {
      bytes.remove_prefix(static_cast<size_t>(written));
      continue;
    }
    if (own_fd_ && written < 0 && errno == EINTR) continue;
    if (own_fd_ && written < 0 && errno != EAGAIN) {
      const int err = errno;
      errors_.fetch_add(1, std::memory_order_relaxed);
      pdr::log::warn("access log: write to {} failed: {}; reopening", open_path_, std::strerror(err));
      close_output();
      return false;
    }
    // The output takes nothing now (or, for standard error, may not): wait until it does, or
    // until stop or a reopen wakes us (a reopen drops the batch: the output it waited for is
    // being replaced).
    pollfd fds[2] = {{fd_, POLLOUT, 0}, {wake_fd_, POLLIN, 0}};
    int timeout_ms = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reopen_) return false;
      if (stop_) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(stop_deadline_ -
                                                                                std::chrono::steady_clock::now());
        if (left.count() <= 0) return false;
        timeout_ms = static_cast<int>(left.count());
      }
    }
    const int ready = ::poll(fds, wake_fd_ >= 0 ? 2 : 1, timeout_ms);
    if (ready < 0 && errno != EINTR) return false;
    if (fds[1].revents & POLLIN) {
      uint64_t drained;
      (void)!::read(wake_fd_, &drained, sizeof drained);
    }
    if (fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) {
      errors_.fetch_add(1, std::memory_order_relaxed);
      close_output();
      return false;
    }
    if (!own_fd_ && (fds[0].revents & POLLOUT)) {
      written = ::write(fd_, bytes.data(), n);
      if (written > 0) bytes.remove_prefix(static_cast<size_t>(written));
      if (written < 0 && errno != EINTR && errno != EAGAIN) {
        errors_.fetch_add(1, std::memory_order_relaxed);
        close_output();
        return false;
      }
    }
  }
  return true;
}

void write_access_log_metrics(MetricsWriter& out, const AccessLog* log) {
  out.counter("pdrouter_access_log_lines_total", "Access log lines written (access_log.path)",
              static_cast<double>(log != nullptr ? log->lines() : 0));
  out.counter("pdrouter_access_log_dropped_total",
              "Access log lines dropped: the writer's queue was full (its output is slow or blocked), or the "
              "output could not be opened or written",
              static_cast<double>(log != nullptr ? log->dropped() : 0));
  out.counter("pdrouter_access_log_errors_total", "Access log outputs that failed to open or to take a write",
              static_cast<double>(log != nullptr ? log->errors() : 0));
}

}  // namespace pdr::router::clients
