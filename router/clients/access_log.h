// AccessLog: one JSON line per client request (access_record.h), written by a thread of its own
// so that a worker never waits for the log's output.
//
// Workers hand over records (log()); a record that finds the queue holding max_queued_lines
// records is dropped and counted (pdrouter_access_log_dropped_total), never waited for. The
// writer thread sleeps while nothing is queued; woken by a line, it gathers lines for
// kFlushInterval (less when the queue is half full, a reopen or stop), takes everything queued at
// once, encodes the lines and writes them in one go, so a worker pays neither a wake-up nor a
// write per request:
// to a file opened for appending (created 0640), or to standard error. The output is written
// non-blocking and waited for with poll(): an output that stops taking bytes (a full pipe or a
// FIFO nobody reads) holds up the writer only, and the queue fills and drops; a FIFO with no
// reader is not opened at all (ENXIO) but retried each second, the lines meanwhile dropped. An
// output that fails (EIO, ENOSPC, a closed pipe) drops that batch, counts an error
// (pdrouter_access_log_errors_total) and is reopened before the next one.
//
// reopen() (SIGUSR1, and every topology reload: SIGHUP) makes the writer close and reopen the
// file before its next write: after logrotate moved it away, lines go to a new file at the
// configured path. configure() with another path switches to it; "" turns the log off (lines
// still queued are dropped).
//
// Threads: configure() and reopen() from the control thread (any thread is safe); log() and
// enabled() from any thread; the writer thread is started by the first configure() that turns
// the log on and stopped (what is queued written for up to kStopFlush) by the destructor.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "router/clients/access_record.h"

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::clients {

class AccessLog {
 public:
  static constexpr std::chrono::milliseconds kFlushInterval{100};
  static constexpr std::chrono::milliseconds kStopFlush{1000};
  static constexpr std::chrono::milliseconds kReopenRetry{1000};

  AccessLog();
  ~AccessLog();
  AccessLog(const AccessLog&) = delete;
  AccessLog& operator=(const AccessLog&) = delete;

  // path: "" = off, "stderr", or a file. The same path and size again change nothing.
  void configure(const std::string& path, size_t max_queued_lines);
  void reopen();

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Queues `record` (dropped when the log is off or its queue is full). Never blocks on I/O.
  void log(AccessRecord&& record);

  uint64_t lines() const { return lines_.load(std::memory_order_relaxed); }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  uint64_t errors() const { return errors_.load(std::memory_order_relaxed); }

 private:
  void run();
  // The writer's output for the current path: open (again) when asked to or after a failure.
  bool ensure_open(const std::string& path);
  void close_output();
  // Writes all of `bytes` (false: an error, or stop past its flush deadline).
  bool write_all(std::string_view bytes);

  std::atomic<bool> enabled_{false};
  std::atomic<uint64_t> lines_{0}, dropped_{0}, errors_{0};

  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<AccessRecord> queue_;  // guarded by mu_
  size_t max_queued_ = 8192;         // guarded by mu_
  std::string path_;                 // guarded by mu_
  bool reopen_ = false;              // guarded by mu_
  bool stop_ = false;                // guarded by mu_
  std::chrono::steady_clock::time_point stop_deadline_{};

  // Writer thread only.
  int fd_ = -1;
  bool own_fd_ = false;
  std::string open_path_;  // the path of the last open attempt
  std::chrono::steady_clock::time_point retry_open_at_{};
  int wake_fd_ = -1;  // eventfd: wakes a writer waiting in poll() for the output (stop)
  std::thread thread_;
};

// pdrouter_access_log_* families (null: zeros).
void write_access_log_metrics(MetricsWriter& out, const AccessLog* log);

}  // namespace pdr::router::clients
