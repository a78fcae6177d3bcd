#include "router/http/http_worker.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <string>

#include "proto/base/log.h"
#include "router/http/http_connection.h"
#include "router/http/json_error.h"

namespace pdr::http {

namespace {

// The descriptor a worker holds in reserve for answering 503 at the open-file limit: a duplicate
// of the loop's own (epoll) descriptor, which is never read or written through it. It needs no
// file system (a container image or chroot may have no /dev/null), and refuse_with_reserve()
// turns an answered connection's descriptor back into one in a single dup3().
int open_reserve_fd(uv_loop_t* loop) { return ::fcntl(uv_backend_fd(loop), F_DUPFD_CLOEXEC, 0); }

// libuv keeps one descriptor of its own per loop (for its accept loop, which pdrouter's listener
// does not use) and opens it at the loop's first stream: a worker's first connection. Opened at
// start instead, it is among the descriptors the router holds from the beginning, rather than
// taken at a random later moment, near the limit, possibly the very number another worker has
// just freed to answer a 503.
void open_libuv_stream_reserve(uv_loop_t* loop) {
  auto* probe = new uv_tcp_t;
  if (uv_tcp_init(loop, probe) != 0) {
    delete probe;
    return;
  }
  uv_close(reinterpret_cast<uv_handle_t*>(probe), [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
}

thread_local HttpWorker* tls_current_worker = nullptr;
constexpr size_t kReadBufferSize = 64 * 1024;
constexpr uint64_t kAcceptBackoffMs = 100;

Status uv_status(StatusCode code, const std::string& what, int rc) {
  return Status(code, what + ": " + uv_strerror(rc));
}
}  // namespace

HttpWorker* HttpWorker::current() { return tls_current_worker; }

HttpWorker::HttpWorker(uint32_t index, ServerShared& shared)
    : index_(index),
      shared_(shared),
      handler_(shared.handler),
      read_buffer_(kReadBufferSize),
      plain_buffer_(shared.options.tls ? kReadBufferSize : 0),
      tls_(shared.tls) {}

HttpWorker::~HttpWorker() {
  if (thread_.joinable()) thread_.join();
  if (reserve_fd_ >= 0) ::close(reserve_fd_);
  reserve_fd_ = -1;
  if (!loop_initialized_) {
    close_listener();
    return;
  }
  // Either the thread already shut everything down, or it never ran: close what is left and let
  // the loop deliver the close callbacks (which free the handles) on this thread.
  for (HttpConnection* c : std::vector<HttpConnection*>(connections_.begin(), connections_.end())) {
    c->close_now();
  }
  close_listener();
  backoff_timer_.close();
  async_.close();
  close_flush_handles();
  uv_run(&loop_, UV_RUN_DEFAULT);
  const int rc = uv_loop_close(&loop_);
  if (rc != 0) pdr::log::error("http worker {}: uv_loop_close: {}", index_, uv_strerror(rc));
}

Status HttpWorker::listen(const std::string& host, uint16_t* port) {
  int rc = uv_loop_init(&loop_);
  if (rc < 0) return uv_status(StatusCode::kIoError, "uv_loop_init", rc);
  loop_initialized_ = true;
  open_libuv_stream_reserve(&loop_);
  rc = async_.init(this, [&](uv_async_t* a) { return uv_async_init(&loop_, a, &HttpWorker::on_async); });
  if (rc < 0) return uv_status(StatusCode::kIoError, "uv_async_init", rc);

  rc = backoff_timer_.init(this, [&](uv_timer_t* t) { return uv_timer_init(&loop_, t); });
  if (rc < 0) return uv_status(StatusCode::kIoError, "uv_timer_init", rc);
  rc = flush_check_.init(this, [&](uv_check_t* c) { return uv_check_init(&loop_, c); });
  if (rc < 0) return uv_status(StatusCode::kIoError, "uv_check_init", rc);
  rc = flush_idle_.init(this, [&](uv_idle_t* i) { return uv_idle_init(&loop_, i); });
  if (rc < 0) return uv_status(StatusCode::kIoError, "uv_idle_init", rc);

  if (uv_ip4_addr(host.c_str(), *port, reinterpret_cast<sockaddr_in*>(&addr_)) != 0) {
    if (uv_ip6_addr(host.c_str(), *port, reinterpret_cast<sockaddr_in6*>(&addr_)) != 0) {
      return Status(StatusCode::kBadAddress, "listen host is not an IPv4 or IPv6 literal: " + host);
    }
  }
  where_ = host + ":" + std::to_string(*port);
  if (Status s = open_listener(); !s.is_ok()) return s;

  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    return Status(StatusCode::kIoError, std::string("getsockname: ") + std::strerror(errno));
  }
  reserve_fd_ = open_reserve_fd(&loop_);
  if (reserve_fd_ < 0) return Status(StatusCode::kIoError, std::string("reserve descriptor: ") + std::strerror(errno));
  *port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  // A reopened listener (accept back-off) binds the port this one got.
  if (addr_.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&addr_)->sin6_port = htons(*port);
  } else {
    reinterpret_cast<sockaddr_in*>(&addr_)->sin_port = htons(*port);
  }
  where_ = host + ":" + std::to_string(*port);
  return Status::ok();
}

Status HttpWorker::open_listener() {
  const int family = addr_.ss_family == AF_INET6 ? AF_INET6 : AF_INET;
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status(StatusCode::kIoError, "socket for " + where_ + ": " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    const std::string why = what + ": " + std::strerror(errno);
    ::close(fd);
    return Status(StatusCode::kIoError, why);
  };
  // SO_REUSEADDR as libuv's bind sets it; SO_REUSEPORT so that every worker binds the port.
  // Server::start probes the port without them first, so an address someone else listens on is
  // refused.
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) return fail("SO_REUSEADDR");
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) return fail("SO_REUSEPORT");
  const socklen_t len = family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr_), len) != 0) return fail("bind " + where_);
  if (::listen(fd, shared_.options.backlog) != 0) return fail("listen " + where_);
  const int rc = listener_.init(this, [&](uv_poll_t* p) { return uv_poll_init_socket(&loop_, p, fd); });
  if (rc < 0) {
    ::close(fd);
    return uv_status(StatusCode::kIoError, "uv_poll_init_socket for " + where_, rc);
  }
  listen_fd_ = fd;
  uv_poll_start(listener_.get(), UV_READABLE, &HttpWorker::on_listener_readable);
  return Status::ok();
}

void HttpWorker::close_listener() {
  listener_.close();  // stops the poll at once; the handle's memory goes in its close callback
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void HttpWorker::accept_failed(int status) {
  shared_.stats.accept_errors.fetch_add(1, std::memory_order_relaxed);
  if (accept_log_.allow(std::chrono::steady_clock::now())) {
    pdr::log::warn("http worker {}: accept error: {}; not accepting for {} ms", index_, uv_strerror(status),
                 kAcceptBackoffMs);
  }
  if (accept_paused_ || draining_) return;
  accept_paused_ = true;
  // Out of descriptors or memory, which every worker of the process (or the whole machine)
  // shares: another worker's listener would fail alike, so the listener stays open and only its
  // poll stops; connections wait in its backlog for the back-off instead of being refused.
  // Anything else may be this listener's own fault: it is closed and bound anew.
  const bool shortage = status == -EMFILE || status == -ENFILE || status == -ENOBUFS || status == -ENOMEM;
  if (shortage && listener_) {
    uv_poll_stop(listener_.get());
  } else {
    close_listener();
  }
  if (backoff_timer_) uv_timer_start(backoff_timer_.get(), &HttpWorker::on_accept_backoff, kAcceptBackoffMs, 0);
}

void HttpWorker::on_accept_backoff(uv_timer_t* timer) {
  auto* w = detail::UvHandle<uv_timer_t>::owner_of<HttpWorker>(timer);
  if (w->draining_) return;
  if (w->listener_ && w->listen_fd_ >= 0) {
    // Paused, not closed: poll it again.
    uv_poll_start(w->listener_.get(), UV_READABLE, &HttpWorker::on_listener_readable);
    w->accept_paused_ = false;
    return;
  }
  if (w->listener_) {
    // The previous listener's close callback has not run yet: try again shortly.
    uv_timer_start(timer, &HttpWorker::on_accept_backoff, kAcceptBackoffMs, 0);
    return;
  }
  Status s = w->open_listener();
  if (!s.is_ok()) {
    w->shared_.stats.accept_errors.fetch_add(1, std::memory_order_relaxed);
    if (w->accept_log_.allow(std::chrono::steady_clock::now())) {
      pdr::log::warn("http worker {}: cannot reopen the listener: {}; retrying in {} ms", w->index_, s.message(),
                   kAcceptBackoffMs);
    }
    w->close_listener();
    uv_timer_start(timer, &HttpWorker::on_accept_backoff, kAcceptBackoffMs, 0);
    return;
  }
  w->accept_paused_ = false;
}

void HttpWorker::start_thread() {
  thread_ = std::thread([this] {
    tls_current_worker = this;
    const std::string name = "pdr-http-" + std::to_string(index_);
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    uv_run(&loop_, UV_RUN_DEFAULT);
    tls_current_worker = nullptr;
  });
}

void HttpWorker::join() {
  if (thread_.joinable()) thread_.join();
}

void HttpWorker::post(std::function<void()> fn) {
  std::function<void()> dropped;  // destroyed outside the lock
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    if (!accepting_posts_ || !async_) {
      dropped = std::move(fn);
    } else {
      posted_.push_back(std::move(fn));
      // Under the lock: shutdown() closes the async handle only after accepting_posts_ is false.
      uv_async_send(async_.get());
    }
  }
}

void HttpWorker::on_async(uv_async_t* async) {
  detail::UvHandle<uv_async_t>::owner_of<HttpWorker>(async)->run_posted();
}

void HttpWorker::run_posted() {
  std::vector<std::function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    batch.swap(posted_);
  }
  for (auto& fn : batch) {
    try {
      fn();
    } catch (const std::exception& e) {
      pdr::log::error("http worker {}: posted task threw: {}", index_, e.what());
    } catch (...) {
      pdr::log::error("http worker {}: posted task threw a non-std exception", index_);
    }
  }
}

void HttpWorker::on_listener_readable(uv_poll_t* poll, int status, int) {
  auto* w = detail::UvHandle<uv_poll_t>::owner_of<HttpWorker>(poll);
  if (status < 0) {
    w->accept_failed(status);
    return;
  }
  w->accept_pending();
}

void HttpWorker::accept_pending() {
  // A bounded batch per wakeup, so one busy listener cannot starve the loop's other work; the
  // poll is level-triggered and calls again while connections wait.
  constexpr int kAcceptBatch = 128;
  for (int i = 0; i < kAcceptBatch && listen_fd_ >= 0; ++i) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      take_connection(fd);
      continue;
    }
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err == EMFILE || err == ENFILE) {
      shared_.stats.accept_errors.fetch_add(1, std::memory_order_relaxed);
      if (refuse_with_reserve()) {
        if (accept_log_.allow(std::chrono::steady_clock::now())) {
          pdr::log::warn("http worker {}: accept error: {}; the connection was answered 503 from the reserve "
                         "descriptor", index_, std::strerror(err));
        }
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    }
    accept_failed(-err);
    return;
  }
}

void HttpWorker::take_connection(int fd) {
  ServerStats& stats = shared_.stats;
  if (stats.connections_active.load(std::memory_order_relaxed) >= shared_.options.max_connections) {
    stats.connections_rejected.fetch_add(1, std::memory_order_relaxed);
    refuse_busy(fd);
    return;
  }
  auto conn = std::make_shared<HttpConnection>(*this);
  const int rc = conn->open(fd);
  if (rc < 0) {
    // open() closed the descriptor; the listener itself is fine.
    stats.accept_errors.fetch_add(1, std::memory_order_relaxed);
    if (accept_log_.allow(std::chrono::steady_clock::now())) {
      pdr::log::warn("http worker {}: cannot take a connection: {}", index_, uv_strerror(rc));
    }
    return;
  }
  connections_.insert(conn.get());
  stats.connections_accepted.fetch_add(1, std::memory_order_relaxed);
  stats.connections_active.fetch_add(1, std::memory_order_relaxed);
}

void HttpWorker::refuse_busy(int fd) {
  answer_busy(fd);
  ::close(fd);
}

void HttpWorker::answer_busy(int fd) {
  static const std::string kAnswer = [] {
    const std::string body = error_body("pdrouter cannot take more connections now; retry later", "server_error",
                                        "too_many_connections");
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
           "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  }();
  // What the client sent already is read first: closing a socket with unread bytes resets the
  // connection (RST), which may reach the client before it reads the answer. A request still
  // on its way finds the socket closed; the answer stays readable on the client's side.
  char sink[4096];
  for (int i = 0; i < 16 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
  const ssize_t sent = ::send(fd, kAnswer.data(), kAnswer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  // Counted before the close, so a client that read its answer finds it counted.
  if (sent == static_cast<ssize_t>(kAnswer.size())) {
    shared_.stats.busy_refusals.fetch_add(1, std::memory_order_relaxed);
  }
  ::shutdown(fd, SHUT_WR);
}

bool HttpWorker::refuse_with_reserve() {
  if (reserve_fd_ < 0) {
    reserve_fd_ = open_reserve_fd(&loop_);  // the last try could not get it back
    errno = EMFILE;
    return false;
  }
  ::close(reserve_fd_);
  reserve_fd_ = -1;
  const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    const int accept_errno = errno;
    reserve_fd_ = open_reserve_fd(&loop_);
    errno = accept_errno;
    return false;
  }
  answer_busy(fd);
  // The answered connection's descriptor becomes the reserve: dup3() closes the socket and puts
  // the duplicate in its place in one step. Closing it and then opening a new reserve would leave
  // the number free for a moment, and another thread (another worker's accept(), a library's
  // open()) could take it: this worker would have no reserve until a descriptor frees, and
  // connections would wait in its backlog instead of being answered.
  if (::dup3(uv_backend_fd(&loop_), fd, O_CLOEXEC) == fd) {
    reserve_fd_ = fd;
    return true;
  }
  ::close(fd);
  reserve_fd_ = open_reserve_fd(&loop_);
  if (reserve_fd_ < 0) {
    errno = EMFILE;
    return false;
  }
  return true;
}

void HttpWorker::connection_closed(HttpConnection* conn) {
  connections_.erase(conn);
  shared_.stats.connections_active.fetch_sub(1);
  if (shared_.stopping.load()) {
    std::lock_guard<std::mutex> lock(shared_.drain_mu);
    shared_.drain_cv.notify_all();
  }
}

void HttpWorker::schedule_flush(std::shared_ptr<HttpConnection> conn) {
  if (!flush_check_) return;  // shut down: nothing is written any more
  if (flush_list_.empty()) {
    uv_check_start(flush_check_.get(), &HttpWorker::on_flush_check);
    uv_idle_start(flush_idle_.get(), [](uv_idle_t*) {});
  }
  flush_list_.push_back(std::move(conn));
}

void HttpWorker::on_flush_check(uv_check_t* check) {
  detail::UvHandle<uv_check_t>::owner_of<HttpWorker>(check)->flush_scheduled();
}

void HttpWorker::flush_scheduled() {
  // Writing can complete an answer and let the next pipelined request be answered at once,
  // which lists the connection again: a few rounds here save a loop turn; beyond them the rest
  // waits for the next turn (the idle handle keeps that turn from blocking).
  constexpr int kRounds = 4;
  for (int round = 0; round < kRounds && !flush_list_.empty(); ++round) {
    // Swapped with a member, so that both vectors keep their capacity (no allocation per turn).
    flush_batch_.swap(flush_list_);
    for (const auto& conn : flush_batch_) conn->flush_output();
    flush_batch_.clear();
  }
  if (flush_list_.empty() && flush_check_) {
    uv_check_stop(flush_check_.get());
    uv_idle_stop(flush_idle_.get());
  }
}

void HttpWorker::close_flush_handles() {
  flush_check_.close();
  flush_idle_.close();
  flush_list_.clear();
  flush_batch_.clear();
}

void HttpWorker::begin_drain() {
  if (draining_) return;
  draining_ = true;
  close_listener();
  backoff_timer_.close();
  for (HttpConnection* c : std::vector<HttpConnection*>(connections_.begin(), connections_.end())) {
    c->begin_drain();
  }
}

void HttpWorker::shutdown() {
  draining_ = true;
  close_listener();
  backoff_timer_.close();
  for (HttpConnection* c : std::vector<HttpConnection*>(connections_.begin(), connections_.end())) {
    c->close_now();
  }
  std::vector<std::function<void()>> rest;
  {
    std::lock_guard<std::mutex> lock(post_mu_);
    accepting_posts_ = false;
    rest.swap(posted_);
  }
  async_.close();
  close_flush_handles();
  for (auto& fn : rest) {
    try {
      fn();
    } catch (...) {
      pdr::log::error("http worker {}: posted task threw during shutdown", index_);
    }
  }
  // Last: posted tasks above may still have used per-worker state.
  if (shared_.options.on_worker_stop) {
    try {
      shared_.options.on_worker_stop(index_);
    } catch (...) {
      pdr::log::error("http worker {}: on_worker_stop threw", index_);
    }
  }
}

}  // namespace pdr::http
