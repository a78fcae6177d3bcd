// Control channel socket helpers (contract: control_socket.h).
#include "transfer/rdma/control_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

Status resolve(const std::string& host, std::uint16_t port, addrinfo** out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, out);
  if (rc != 0) {
    return Status(StatusCode::kBadAddress, "cannot resolve " + host + ": " + ::gai_strerror(rc));
  }
  return Status::ok();
}

}  // namespace

bool split_host_port(const std::string& address, std::string* host, std::uint16_t* port) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= address.size()) return false;
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  unsigned long value = 0;
  for (std::size_t i = colon + 1; i < address.size(); ++i) {
    const char c = address[i];
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned long>(c - '0');
    if (value > 65535) return false;
  }
  if (value == 0 || h.empty()) return false;
  *host = h;
  *port = static_cast<std::uint16_t>(value);
  return true;
}

Status control_listen(const std::string& host, std::uint16_t port, int* fd,
                      std::uint16_t* bound_port) {
  addrinfo* info = nullptr;
  if (Status s = resolve(host, port, &info); !s) return s;
  const int sock = ::socket(info->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock < 0) {
    ::freeaddrinfo(info);
    return errno_status("socket", errno);
  }
  const int one = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(sock, info->ai_addr, info->ai_addrlen) != 0 || ::listen(sock, 128) != 0) {
    const int error = errno;
    ::freeaddrinfo(info);
    ::close(sock);
    return errno_status("bind/listen " + host + ":" + std::to_string(port), error);
  }
  ::freeaddrinfo(info);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(sock, reinterpret_cast<sockaddr*>(&addr), &len);
  *bound_port = addr.ss_family == AF_INET6
                    ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  *fd = sock;
  return Status::ok();
}

Status control_connect(const std::string& address, ControlClock::time_point deadline, int* fd) {
  std::string host;
  std::uint16_t port = 0;
  if (!split_host_port(address, &host, &port)) {
    return Status(StatusCode::kBadAddress, "rdma control address '" + address + "' is not host:port");
  }
  addrinfo* info = nullptr;
  if (Status s = resolve(host, port, &info); !s) return s;
  const int sock = ::socket(info->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (sock < 0) {
    ::freeaddrinfo(info);
    return errno_status("socket", errno);
  }
  int rc = ::connect(sock, info->ai_addr, info->ai_addrlen);
  ::freeaddrinfo(info);
  if (rc != 0 && errno != EINPROGRESS) {
    const int error = errno;
    ::close(sock);
    return errno_status("connect " + address, error);
  }
  if (rc != 0) {
    if (Status s = wait_fd(sock, POLLOUT, deadline, "connect"); !s) {
      ::close(sock);
      return s;
    }
    int error = 0;
    socklen_t len = sizeof(error);
    ::getsockopt(sock, SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) {
      ::close(sock);
      return errno_status("connect " + address, error);
    }
  }
  const int one = 1;
  ::setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
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
