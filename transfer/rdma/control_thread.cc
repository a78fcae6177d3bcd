// The serving side of the RDMA handshake and the control-socket watch (contract: control_thread.h).
#include "transfer/rdma/control_thread.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <span>
#include <string>

namespace pdr::transfer::rdma {

void ControlThread::close_all() {
  for (const auto& [fd, gen] : watched_) ::close(fd);
  for (const auto& [fd, gen] : state_.watch_adds) ::close(fd);
  watched_.clear();
  state_.watch_adds.clear();
}

void ControlThread::run() {
  std::vector<pollfd> fds;
  for (;;) {
    {
      std::lock_guard lock(state_.mu);
      if (state_.stopping) return;
      watched_.insert(watched_.end(), state_.watch_adds.begin(), state_.watch_adds.end());
      state_.watch_adds.clear();
    }
    fds.clear();
    fds.push_back({state_.wake_fd, POLLIN, 0});
    fds.push_back({state_.listen_fd, POLLIN, 0});
    for (const auto& [fd, gen] : watched_) fds.push_back({fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 1000) <= 0) continue;
    if ((fds[0].revents & POLLIN) != 0) {
      std::uint64_t value = 0;
      (void)!::read(state_.wake_fd, &value, sizeof(value));
    }
    // accept_one() only appends to watched_, so fds[i] still matches watched_[i - 2] below.
    if ((fds[1].revents & POLLIN) != 0) accept_one();
    std::vector<std::pair<int, std::uint32_t>> closed;
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char byte;
      const ssize_t n = ::recv(fds[i].fd, &byte, 1, MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      // EOF, an error, or bytes after the handshake (a protocol violation): the connection ends.
      if (n > 0) state_.count(&EngineCounters::bad_frames);
      closed.push_back(watched_[i - 2]);
    }
    if (!closed.empty()) drop(closed);
  }
}

void ControlThread::drop(const std::vector<std::pair<int, std::uint32_t>>& closed) {
  std::vector<Finished> finished;
  {
    std::lock_guard lock(state_.mu);
    for (const auto& [fd, gen] : closed) {
      auto it = state_.conns.find(gen);
      if (it != state_.conns.end() && it->second->fd == fd) {
        it->second->fd = -1;  // we close it below
        state_.break_conn(gen, XferCause::kPeerGone, &finished);
      }
    }
  }
  for (const auto& entry : closed) {
    ::close(entry.first);
    watched_.erase(std::find(watched_.begin(), watched_.end(), entry));
  }
  State::run_finished(finished);
}

void ControlThread::accept_one() {
  const int fd = ::accept4(state_.listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  const auto deadline =
      ControlClock::now() + std::chrono::milliseconds(state_.options.connect_timeout_ms);
  std::string bytes;
  proto::RdmaHandshake remote;
  Status s = control_recv_record(fd, proto::kRdmaHandshakeMaxBytes, deadline, &bytes);
  if (s) {
    s = proto::decode_rdma_handshake(std::as_bytes(std::span(bytes)), &remote);
    if (!s) state_.count(&EngineCounters::bad_frames);
  }
  if (!s) {
    ::close(fd);
    return;
  }
  std::uint32_t gen = 0;
  std::string record;
  // A serving connection has no tasks, so breaking it below finishes nothing.
  std::vector<Finished> finished;
  {
    std::lock_guard lock(state_.mu);
    Connection* conn = nullptr;
    if (state_.stopping || !state_.create_conn(true, remote.qpn.size(), &conn)) {
      ::close(fd);
      return;
    }
    gen = conn->gen;
    if (!bring_up(state_.device, *conn, remote)) {
      state_.break_conn(gen, XferCause::kPeerGone, &finished);
      ::close(fd);
      return;
    }
    conn->fd = fd;
    conn->fd_watched = true;  // this thread watches it below
    conn->ready = true;
    record = proto::encode_rdma_handshake(local_record(state_.device, *conn, state_.context.agent));
  }
  if (!control_send_record(fd, record, deadline)) {
    std::lock_guard lock(state_.mu);
    state_.break_conn(gen, XferCause::kPeerGone, &finished);  // shuts the fd down; closed via watched_
  }
  watched_.emplace_back(fd, gen);
}

}  // namespace pdr::transfer::rdma
