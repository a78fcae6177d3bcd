#include "transfer/tcp/io_thread.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transfer/tcp/lane.h"
#include "transfer/tcp/serving_connection.h"
#include "transfer/net/tcp_socket.h"

namespace pdr::transfer::tcp {

IoThread::IoThread(const Shared& shared) : shared_(shared) {}

IoThread::~IoThread() {
  // Only reached with leftovers when the loop never ran (start() not called).
  for (const Command& command : commands_) {
    if (command.kind == Command::Kind::kAdopt) ::close(command.fd);
    if (command.kind == Command::Kind::kAddLane) delete command.lane;
  }
  lanes_.clear();
  serving_.clear();
  graveyard_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

Status IoThread::init() {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return Status(StatusCode::kIoError, std::string("epoll_create1: ") + std::strerror(errno));
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Status(StatusCode::kIoError, std::string("eventfd: ") + std::strerror(errno));
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.ptr = &wake_tag_;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &event) != 0) {
    return Status(StatusCode::kIoError, std::string("epoll_ctl: ") + std::strerror(errno));
  }
  return {};
}

void IoThread::set_listener(int fd, std::vector<IoThread*> acceptors) {
  listen_fd_ = fd;
  acceptors_ = std::move(acceptors);
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.ptr = &listen_tag_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &event);
}

void IoThread::start() { thread_ = std::thread([this] { run(); }); }

void IoThread::join() {
  if (thread_.joinable()) thread_.join();
}

bool IoThread::post(const Command& command) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    wake = commands_.empty();
    commands_.push_back(command);
  }
  if (wake) {
    const std::uint64_t one = 1;
    // A full counter (impossible in practice) still leaves the eventfd readable, so ignore errors.
    [[maybe_unused]] const ssize_t rc = ::write(wake_fd_, &one, sizeof one);
  }
  return true;
}

void IoThread::watch(int fd, Connection* connection, std::uint32_t events) {
  epoll_event event{};
  event.events = events;
  event.data.ptr = connection;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event);
}

void IoThread::rewatch(int fd, Connection* connection, std::uint32_t events) {
  epoll_event event{};
  event.events = events;
  event.data.ptr = connection;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &event);
}

void IoThread::unwatch(int fd) { ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr); }

void IoThread::retire(ServingConnection* connection) {
  auto it = std::find_if(serving_.begin(), serving_.end(),
                         [&](const std::unique_ptr<ServingConnection>& c) { return c.get() == connection; });
  if (it == serving_.end()) return;
  graveyard_.push_back(std::move(*it));
  serving_.erase(it);
}

int IoThread::next_timeout_ms() const {
  Clock::time_point next = Clock::time_point::max();
  for (const auto& lane : lanes_) next = std::min(next, lane->next_deadline());
  for (const auto& connection : serving_) next = std::min(next, connection->hello_deadline());
  if (next == Clock::time_point::max()) return -1;
  const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(wait, 0, 60'000));
}

void IoThread::run() {
  constexpr int kMaxEvents = 64;
  epoll_event events[kMaxEvents];
  while (!stopping_) {
    const int count = ::epoll_wait(epoll_fd_, events, kMaxEvents, next_timeout_ms());
    if (count < 0 && errno != EINTR) break;  // cannot happen with a valid epoll fd
    for (int i = 0; i < count && !stopping_; ++i) {
      void* tag = events[i].data.ptr;
      if (tag == &wake_tag_) {
        std::uint64_t value = 0;
        [[maybe_unused]] const ssize_t rc = ::read(wake_fd_, &value, sizeof value);
        run_commands();
      } else if (tag == &listen_tag_) {
        accept_all();
      } else {
        static_cast<Connection*>(tag)->on_events(events[i].events);
      }
    }
    // Connections retired this round may still have had events in `events`: free them only now.
    graveyard_.clear();
    const Clock::time_point now = Clock::now();
    for (const auto& lane : lanes_) lane->on_timer(now);
    expire_unauthenticated(now);
  }
  shut_down();
}

void IoThread::run_commands() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_.swap(commands_);
  }
  for (const Command& command : running_) execute(command);
  running_.clear();
}

void IoThread::execute(const Command& command) {
  switch (command.kind) {
    case Command::Kind::kAddLane:
      lanes_.emplace_back(command.lane);
      break;
    case Command::Kind::kRemoveLane: {
      auto it = std::find_if(lanes_.begin(), lanes_.end(),
                             [&](const std::unique_ptr<Lane>& lane) { return lane.get() == command.lane; });
      if (it == lanes_.end()) break;
      (*it)->fail_all(XferCause::kPeerGone);
      graveyard_.push_back(std::move(*it));
      lanes_.erase(it);
      break;
    }
    case Command::Kind::kSubmit:
      command.lane->submit(command.batch);
      break;
    case Command::Kind::kCancel:
      for (const auto& lane : lanes_) lane->cancel(command.xfer_id, command.cause);
      break;
    case Command::Kind::kAdopt:
      // Listed before start(): a connection that fails at once retires itself from serving_.
      serving_.push_back(std::make_unique<ServingConnection>(*this, shared_, command.fd));
      serving_.back()->start();
      break;
    case Command::Kind::kStop:
      stopping_ = true;
      break;
  }
}

void IoThread::accept_all() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // EAGAIN: drained. Anything else (EMFILE, ECONNABORTED): try again on the next readiness.
      return;
    }
    // The cap counts connections until they are closed, so a flood of silent connects is bounded
    // by max_connections * hello_timeout, and each costs no buffers before it authenticates.
    if (shared_.serving_connections.fetch_add(1, std::memory_order_relaxed) >=
        shared_.options.max_connections) {
      shared_.serving_connections.fetch_sub(1, std::memory_order_relaxed);
      shared_.counters->connections_refused.fetch_add(1, std::memory_order_relaxed);
      ::close(fd);
      continue;
    }
    set_tcp_nodelay(fd);  // every frame is written whole: Nagle would only delay ACKs and READ_REQs
    IoThread* target = acceptors_[next_acceptor_++ % acceptors_.size()];
    if (!target->post({.kind = Command::Kind::kAdopt, .fd = fd})) {
      shared_.serving_connections.fetch_sub(1, std::memory_order_relaxed);
      ::close(fd);
    }
  }
}

void IoThread::expire_unauthenticated(Clock::time_point now) {
  // close_connection() retires (moves) the connection out of serving_: collect first.
  std::vector<ServingConnection*> expired;
  for (const auto& connection : serving_) {
    if (connection->hello_deadline() <= now) expired.push_back(connection.get());
  }
  for (ServingConnection* connection : expired) connection->on_timer(now);
}

void IoThread::shut_down() {
  // Refuse new commands, then run the ones that made it in: every batch posted before this point
  // reaches a lane and is settled below, so no task is left unfinished.
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  run_commands();
  for (const auto& lane : lanes_) lane->fail_all(XferCause::kPeerGone);
  for (const auto& connection : serving_) connection->shutdown();
  lanes_.clear();
  serving_.clear();
  graveyard_.clear();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
  }
}

}  // namespace pdr::transfer::tcp
