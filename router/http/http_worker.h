// One HTTP worker: a thread running its own uv loop with its own SO_REUSEPORT listener and the
// connections accepted on it (internal to router/http/).
//
// Lifecycle (driven by Server): listen() and start_thread() on the starting thread; post() from
// any thread; begin_drain() and shutdown() run on the worker thread via post(); join(), then
// destruction on the stopping thread.
#pragma once

#include <uv.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "proto/base/log_limiter.h"
#include "proto/base/snapshot_cell.h"
#include "proto/base/status.h"
#include "router/http/http_server.h"
#include "router/http/uv_handle.h"

namespace pdr::http {

class HttpConnection;

// State shared by all workers of one server.
struct ServerShared {
  ServerOptions options;
  Handler handler;
  ServerStats stats;
  std::atomic<bool> stopping{false};
  // The TLS context new connections handshake with (null: plain TCP); Server::set_tls replaces it.
  SnapshotCell<TlsServerContext> tls{nullptr};
  std::mutex drain_mu;                // with drain_cv: stop() waits for connections_active == 0
  std::condition_variable drain_cv;
};

class HttpWorker {
 public:
  HttpWorker(uint32_t index, ServerShared& shared);
  ~HttpWorker();
  HttpWorker(const HttpWorker&) = delete;
  HttpWorker& operator=(const HttpWorker&) = delete;

  // Initialises the loop and binds + listens. `*port` in: wanted port (0 = ephemeral);
  // out: bound port.
  Status listen(const std::string& host, uint16_t* port);
  void start_thread();
  void join();

  // Thread-safe. Drops `fn` once the worker has shut down.
  void post(std::function<void()> fn);

  // Worker thread only.
  void begin_drain();  // close the listener and idle connections
  void shutdown();     // close everything; the loop then ends

  uint32_t index() const { return index_; }
  uv_loop_t* loop() { return &loop_; }
  bool draining() const { return draining_; }
  const ServerOptions& options() const { return shared_.options; }
  ServerStats& stats() { return shared_.stats; }
  const Handler& handler() const { return handler_; }
  // Per-worker scratch buffer for uv_read (reads are copied out before the next one).
  char* read_buffer() { return read_buffer_.data(); }
  size_t read_buffer_size() const { return read_buffer_.size(); }
  // TLS listeners: the plaintext of one socket read is decrypted into this (the ciphertext is in
  // the session by then, so read_buffer() is free again, but a callback may read more).
  char* plain_buffer() { return plain_buffer_.data(); }
  size_t plain_buffer_size() const { return plain_buffer_.size(); }
  // The context a connection accepted now handshakes with; null on a plain listener.
  const std::shared_ptr<const TlsServerContext>& tls() { return tls_.get(); }

  // Called by HttpConnection from its tcp close callback.
  void connection_closed(HttpConnection* conn);

  // Output is written once per loop turn: a connection that queued bytes (answers, stream
  // chunks) is listed here and written after every callback of the turn has run, so a stream's
  // head, the events of one upstream read and the terminating chunk leave in one write. The
  // list holds a reference until then.
  void schedule_flush(std::shared_ptr<HttpConnection> conn);

  // The worker running on this thread, or nullptr.
  static HttpWorker* current();

 private:
  // The listening socket is pdrouter's own (a uv_poll on it), not a uv_listen stream: libuv's
  // accept loop answers EMFILE by accepting and closing every pending connection (a bare TCP
  // close), and pdrouter answers those with an HTTP 503 instead (reserve_fd_ below).
  static void on_listener_readable(uv_poll_t* poll, int status, int events);
  void accept_pending();
  // A new client connection on `fd` (accepted, non-blocking): served, or refused when
  // max_connections are open.
  void take_connection(int fd);
  // Answers an accepted connection 503 (Retry-After: 1) at once, and closes it; counted.
  void refuse_busy(int fd);
  // refuse_busy() without the close: the answer is sent and the write side shut down.
  void answer_busy(int fd);
  // accept() found no descriptor (EMFILE/ENFILE): the reserve descriptor is closed, one pending
  // connection accepted into its number and answered 503, and that number made the reserve
  // again (the classic reserve-fd trick, without a moment in which the number is free). False
  // when there was no reserve, no pending connection, or the reserve could not be had back.
  bool refuse_with_reserve();
  static void on_accept_backoff(uv_timer_t* timer);
  // Creates the SO_REUSEPORT listener on addr_ and listens.
  Status open_listener();
  void close_listener();
  // accept() failed and the reserve could not help: the listener would report the error again
  // at once for as long as it lasts, so it is left alone for kAcceptBackoff. Out of descriptors
  // or memory (shared by every worker), only its poll stops and connections wait in its backlog;
  // on any other error it is closed and bound anew, connections meanwhile going to the other
  // workers or refused.
  void accept_failed(int status);
  static void on_async(uv_async_t* async);
  void run_posted();
  // uv_check: runs after the poll phase's callbacks. The idle handle is active while anything
  // is listed, so that bytes queued outside the poll phase (timers, close callbacks) do not
  // wait for the next event: with an active idle handle the next poll does not block.
  static void on_flush_check(uv_check_t* check);
  void flush_scheduled();
  void close_flush_handles();

  const uint32_t index_;
  ServerShared& shared_;
  Handler handler_;  // own copy, so workers never share the std::function object
  uv_loop_t loop_{};
  bool loop_initialized_ = false;
  detail::UvHandle<uv_async_t> async_;
  detail::UvHandle<uv_poll_t> listener_;  // polls listen_fd_
  int listen_fd_ = -1;
  int reserve_fd_ = -1;  // held so that EMFILE still leaves room to answer a 503 (open_reserve_fd)
  detail::UvHandle<uv_timer_t> backoff_timer_;
  detail::UvHandle<uv_check_t> flush_check_;
  detail::UvHandle<uv_idle_t> flush_idle_;
  std::vector<std::shared_ptr<HttpConnection>> flush_list_;
  std::vector<std::shared_ptr<HttpConnection>> flush_batch_;  // being flushed (flush_scheduled)
  sockaddr_storage addr_{};
  std::string where_;  // "host:port" for messages
  bool accept_paused_ = false;
  LogLimiter accept_log_{"http accept errors"};
  std::thread thread_;
  bool draining_ = false;
  std::unordered_set<HttpConnection*> connections_;
  std::vector<char> read_buffer_;
  std::vector<char> plain_buffer_;  // TLS listeners only (empty on a plain one)
  SnapshotReader<TlsServerContext> tls_;

  std::mutex post_mu_;
  std::vector<std::function<void()>> posted_;
  bool accepting_posts_ = true;
};

}  // namespace pdr::http
