// Deadline-bounded socket calls (contract: blocking_socket.h).
#include "transfer/net/blocking_socket.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <vector>

#include "transfer/net/tcp_socket.h"

namespace pdr {

namespace {

Status errno_status(std::string_view what, int error) {
  return Status(StatusCode::kIoError, std::string(what) + ": " + std::strerror(error));
}

// poll(2)'s timeout for the time left. Rounded up: rounding down would poll(0) and report a
// timeout up to a millisecond before the deadline.
int poll_timeout_ms(SocketClock::time_point deadline) {
  if (deadline == kNoDeadline) return -1;
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(deadline - SocketClock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, INT_MAX));
}

// With a deadline, a call must not block in the kernel on a blocking socket.
int no_wait_flag(SocketClock::time_point deadline) {
  return deadline == kNoDeadline ? 0 : MSG_DONTWAIT;
}

bool would_block(int error) { return error == EAGAIN || error == EWOULDBLOCK; }

}  // namespace

Status wait_socket(int fd, short events, SocketClock::time_point deadline, std::string_view what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (rc > 0) return Status::ok();
    if (rc == 0) {
      if (SocketClock::now() >= deadline) {
        return Status(StatusCode::kIoError, std::string(what) + ": timed out");
      }
      continue;  // woke a hair early (clock granularity): wait out the rest
    }
    if (errno != EINTR) return errno_status(what, errno);
  }
}

Status connect_tcp(const std::string& host, std::uint16_t port, SocketClock::time_point deadline,
                   UniqueFd* out) {
  std::vector<SocketAddress> addresses;
  if (Status s = resolve_addresses(host, port, &addresses); !s) return s;
  const std::string what = "connect to " + join_host_port(host, port);
  Status last;
  for (const SocketAddress& address : addresses) {
    int raw = -1;
    int rc = start_connect(address, &raw);
    if (rc != 0 && rc != -EINPROGRESS) {
      last = errno_status(what, -rc);
      continue;
    }
    UniqueFd fd(raw);
    if (rc == -EINPROGRESS) {
      // The deadline covers every address: once it has passed there is no point trying the next.
      if (Status s = wait_socket(fd.get(), POLLOUT, deadline, what); !s) return s;
      if (rc = finish_connect(fd.get()); rc != 0) {
        last = errno_status(what, -rc);
        continue;
      }
    }
    *out = std::move(fd);
    return Status::ok();
  }
  return last;
}

Status send_all(int fd, const void* data, std::size_t size, SocketClock::time_point deadline) {
  const auto* bytes = static_cast<const char*>(data);
  const int flags = MSG_NOSIGNAL | no_wait_flag(deadline);
  std::size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, bytes + sent, size - sent, flags);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
    } else if (n == 0 || would_block(errno)) {
      if (Status s = wait_socket(fd, POLLOUT, deadline, "send"); !s) return s;
    } else if (errno != EINTR) {
      return errno_status("send", errno);
    }
  }
  return Status::ok();
}

Status recv_exact(int fd, void* out, std::size_t size, SocketClock::time_point deadline) {
  auto* bytes = static_cast<char*>(out);
  const int flags = no_wait_flag(deadline);
  std::size_t got = 0;
  while (got < size) {
    const ssize_t n = ::recv(fd, bytes + got, size - got, flags);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n == 0) {
      return Status(StatusCode::kIoError, "receive: closed by the peer after " +
                                              std::to_string(got) + " of " +
                                              std::to_string(size) + " bytes");
    } else if (would_block(errno)) {
      if (Status s = wait_socket(fd, POLLIN, deadline, "receive"); !s) return s;
    } else if (errno != EINTR) {
      return errno_status("receive", errno);
    }
  }
  return Status::ok();
}

Status recv_some(int fd, void* out, std::size_t capacity, SocketClock::time_point deadline,
                 std::size_t* received) {
  const int flags = no_wait_flag(deadline);
  for (;;) {
    const ssize_t n = ::recv(fd, out, capacity, flags);
    if (n >= 0) {
      *received = static_cast<std::size_t>(n);
      return Status::ok();
    }
    if (would_block(errno)) {
      if (Status s = wait_socket(fd, POLLIN, deadline, "receive"); !s) return s;
    } else if (errno != EINTR) {
      return errno_status("receive", errno);
    }
  }
}

}  // namespace pdr
