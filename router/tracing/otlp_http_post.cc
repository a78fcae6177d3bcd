#include "router/tracing/otlp_http_post.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace pdr::router::tracing {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxAnswerHead = 16 * 1024;  // the answer's body is not read

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Waits for `events` on fd until `deadline`: 1 ready, 0 timed out (or cancel_fd readable:
// *cancelled set), -1 error (errno set).
int wait_for(int fd, short events, Clock::time_point deadline, int cancel_fd, bool* cancelled) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return 0;
    pollfd p[2] = {{fd, events, 0}, {cancel_fd, POLLIN, 0}};
    const int rc = ::poll(p, cancel_fd >= 0 ? 2 : 1, static_cast<int>(left));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return rc;
    if (cancel_fd >= 0 && p[1].revents != 0) {
      *cancelled = true;
      return 0;
    }
    return 1;
  }
}

Status io_error(const proto::HostPort& to, const std::string& what) {
  return Status(StatusCode::kIoError, "collector " + to.to_string() + ": " + what);
}

}  // namespace

Status otlp_http_post(const proto::HostPort& collector, std::string_view path, std::string_view content_type,
                      std::string_view body, std::chrono::milliseconds timeout, int* status, int cancel_fd) {
  const Clock::time_point deadline = Clock::now() + timeout;
  bool cancelled = false;
  auto gave_up = [&](const std::string& what) {
    return cancelled ? Status(StatusCode::kIoError, "collector " + collector.to_string() + ": export cancelled")
                     : io_error(collector, what);
  };
  const std::string timed_out = "timed out after " + std::to_string(timeout.count()) + " ms";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(collector.port);
  if (const int rc = ::getaddrinfo(collector.host.c_str(), port.c_str(), &hints, &found); rc != 0 || found == nullptr) {
    return io_error(collector, std::string("cannot resolve: ") + gai_strerror(rc));
  }
  Fd sock;
  sock.fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sock.fd < 0) {
    ::freeaddrinfo(found);
    return io_error(collector, std::string("socket: ") + std::strerror(errno));
  }
  int rc = ::connect(sock.fd, found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  if (rc != 0 && errno != EINPROGRESS) return io_error(collector, std::string("connect: ") + std::strerror(errno));
  if (rc != 0) {
    if (wait_for(sock.fd, POLLOUT, deadline, cancel_fd, &cancelled) <= 0) return gave_up("connect " + timed_out);
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(sock.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return io_error(collector, std::string("connect: ") + std::strerror(err));
  }
  std::string request;
  request.reserve(body.size() + 256);
  request.append("POST ").append(path).append(" HTTP/1.1\r\nHost: ").append(collector.to_string());
  request.append("\r\nContent-Type: ").append(content_type);
  request.append("\r\nContent-Length: ").append(std::to_string(body.size()));
  request.append("\r\nConnection: close\r\nUser-Agent: pdrouter/" PDR_VERSION "\r\n\r\n");
  request.append(body);
  std::string_view rest = request;
  while (!rest.empty()) {
    const ssize_t n = ::send(sock.fd, rest.data(), rest.size(), MSG_NOSIGNAL);
    if (n > 0) {
      rest.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return io_error(collector, std::string("send: ") + std::strerror(errno));
    }
    if (wait_for(sock.fd, POLLOUT, deadline, cancel_fd, &cancelled) <= 0) return gave_up("send " + timed_out);
  }
  std::string head;
  char buf[4096];
  while (head.find("\r\n") == std::string::npos) {
    const ssize_t n = ::recv(sock.fd, buf, sizeof buf, 0);
    if (n > 0) {
      head.append(buf, static_cast<size_t>(n));
      if (head.size() > kMaxAnswerHead) break;
      continue;
    }
    if (n == 0) break;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return io_error(collector, std::string("recv: ") + std::strerror(errno));
    }
    if (wait_for(sock.fd, POLLIN, deadline, cancel_fd, &cancelled) <= 0) return gave_up("answer " + timed_out);
  }
  // "HTTP/1.1 200 OK": the status is all an exporter needs (OTLP's partial_success is not read).
  if (head.size() < 12 || head.compare(0, 5, "HTTP/") != 0 || head[8] != ' ') {
    return Status(StatusCode::kMalformed, "collector " + collector.to_string() + ": not an HTTP answer");
  }
  int code = 0;
  const auto [end, ec] = std::from_chars(head.data() + 9, head.data() + 12, code);
  if (ec != std::errc() || end != head.data() + 12) {
    return Status(StatusCode::kMalformed, "collector " + collector.to_string() + ": bad status line");
  }
  *status = code;
  return Status::ok();
}

}  // namespace pdr::router::tracing
