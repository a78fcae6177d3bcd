// Control channel socket helpers (contract: control_socket.h).
#include "transfer/rdma/control_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "transfer/socket_ops.h"

namespace pdr::transfer::rdma {

namespace {

Status errno_status(const std::string& what, int error) {
  return Status(StatusCode::kIoError, what + ": " + std::strerror(error));
}

int remaining_ms(ControlClock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                          ControlClock::now());
  return left.count() <= 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), 1 << 30));
}

// Waits for `events` on fd until the deadline; EINTR restarts.
Status wait_fd(int fd, short events, ControlClock::time_point deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return Status::ok();
    if (rc == 0) return Status(StatusCode::kIoError, std::string(what) + ": timed out");
    if (errno != EINTR) return errno_status(what, errno);
  }
}

}  // namespace

// Socket set-up is transfer/socket_ops.h, shared with the tcp backend (the listener is its
// open_listener); what is left here is the deadline-bounded connect and the record framing.
Status control_connect(const std::string& address, ControlClock::time_point deadline, int* fd) {
  std::string host;
  std::uint16_t port = 0;
  if (Status s = split_host_port(address, &host, &port); !s) return s;
  SocketAddress target;
  if (Status s = resolve_address(host, port, &target); !s) return s;
  int sock = -1;
  int rc = start_connect(target, &sock);  // also sets TCP_NODELAY
  if (rc == -EINPROGRESS) {
    if (Status s = wait_fd(sock, POLLOUT, deadline, "connect"); !s) {
      ::close(sock);
      return s;
    }
    rc = finish_connect(sock);
    if (rc != 0) ::close(sock);
  }
  if (rc != 0) return errno_status("connect " + address, -rc);
  *fd = sock;
  return Status::ok();
}

Status control_send_record(int fd, const std::string& record, ControlClock::time_point deadline) {
  std::string frame;
  frame.reserve(4 + record.size());
  const auto size = static_cast<std::uint32_t>(record.size());
  for (int i = 0; i < 4; ++i) frame.push_back(static_cast<char>(size >> (8 * i) & 0xff));
  frame += record;
  std::size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t n = ::send(fd, frame.data() + sent, frame.size() - sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Status s = wait_fd(fd, POLLOUT, deadline, "send handshake"); !s) return s;
    } else if (n < 0 && errno != EINTR) {
      return errno_status("send handshake", errno);
    }
  }
  return Status::ok();
}

namespace {
Status recv_exact(int fd, char* out, std::size_t size, ControlClock::time_point deadline) {
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::recv(fd, out + got, size - got, MSG_DONTWAIT);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n == 0) {
      return Status(StatusCode::kIoError, "control connection closed by the peer");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (Status s = wait_fd(fd, POLLIN, deadline, "receive handshake"); !s) return s;
    } else if (errno != EINTR) {
      return errno_status("receive handshake", errno);
    }
  }
  return Status::ok();
}
}  // namespace

Status control_recv_record(int fd, std::size_t max_bytes, ControlClock::time_point deadline,
                           std::string* record) {
  char prefix[4];
  if (Status s = recv_exact(fd, prefix, 4, deadline); !s) return s;
  std::uint32_t size = 0;
  for (int i = 0; i < 4; ++i) size |= static_cast<std::uint32_t>(static_cast<unsigned char>(prefix[i])) << (8 * i);
  if (size > max_bytes) {
    return Status(StatusCode::kTooLarge, "handshake record is " + std::to_string(size) +
                                             " bytes, limit " + std::to_string(max_bytes));
  }
  record->resize(size);
  return recv_exact(fd, record->data(), size, deadline);
}

}  // namespace pdr::transfer::rdma
