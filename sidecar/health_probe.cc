#include "sidecar/health_probe.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <llhttp.h>

namespace pdr::sidecar {
namespace {

using Clock = std::chrono::steady_clock;

// Owns a socket descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Waits for `events` on fd until the deadline. Returns "" when ready, else the error.
std::string wait_ready(int fd, short events, Clock::time_point deadline, const char* phase) {
  while (true) {
    pollfd p{fd, events, 0};
    int n = poll(&p, 1, remaining_ms(deadline));
    if (n > 0) return "";
    if (n == 0) return std::string("timeout during ") + phase;
    if (errno != EINTR) return std::string("poll: ") + std::strerror(errno);
  }
}

struct ParseState {
  bool complete = false;
};

int on_message_complete(llhttp_t* parser) {
  static_cast<ParseState*>(parser->data)->complete = true;
  // Stop parsing here: anything after the first response is not ours to read.
  return HPE_PAUSED;
}

std::string connect_with_deadline(const proto::HostPort& address, Clock::time_point deadline,
                                  int* out_fd) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* results = nullptr;
  const std::string port = std::to_string(address.port);
  if (int rc = getaddrinfo(address.host.c_str(), port.c_str(), &hints, &results); rc != 0) {
    return "resolve " + address.host + ": " + gai_strerror(rc);
  }
  std::string error = "no address for " + address.host;
  for (addrinfo* ai = results; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      error = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    Fd guard(fd);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
      error = std::string("connect: ") + std::strerror(errno);
      continue;
    }
    error = wait_ready(fd, POLLOUT, deadline, "connect");
    if (!error.empty()) break;
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      error = std::string("connect: ") + std::strerror(so_error);
      continue;
    }
    *out_fd = guard.release();
    error.clear();
    break;
  }
  freeaddrinfo(results);
  return error;
}

std::string send_all(int fd, const std::string& data, Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) return std::string("send: ") + std::strerror(errno);
    if (std::string e = wait_ready(fd, POLLOUT, deadline, "send"); !e.empty()) return e;
  }
  return "";
}

// Reads and parses until the response is complete, the peer closes, or the deadline passes.
HealthProbeResult read_response(int fd, Clock::time_point deadline) {
  llhttp_settings_t settings;
  llhttp_settings_init(&settings);
  settings.on_message_complete = on_message_complete;
  llhttp_t parser;
  llhttp_init(&parser, HTTP_RESPONSE, &settings);
  ParseState state;
  parser.data = &state;

  HealthProbeResult result;
  char buffer[4096];
  while (!state.complete) {
    if (std::string e = wait_ready(fd, POLLIN, deadline, "read"); !e.empty()) {
      result.error = e;
      return result;
    }
    ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      result.error = std::string("recv: ") + std::strerror(errno);
      return result;
    }
    llhttp_errno_t rc = n == 0 ? llhttp_finish(&parser)
                               : llhttp_execute(&parser, buffer, static_cast<size_t>(n));
    if (rc != HPE_OK && rc != HPE_PAUSED) {
      result.error = std::string("bad HTTP response: ") + llhttp_errno_name(rc) + " " +
                     (llhttp_get_error_reason(&parser) ? llhttp_get_error_reason(&parser) : "");
      return result;
    }
    if (n == 0 && !state.complete) {
      result.error = "connection closed before the response was complete";
      return result;
    }
  }
  result.status_code = parser.status_code;
  return result;
}

}  // namespace

std::string HealthProbeResult::describe() const {
  if (!error.empty()) return error;
  return "HTTP " + std::to_string(status_code);
}

Status HealthProbe::from_url(std::string_view url, std::chrono::milliseconds timeout,
                             HealthProbe* out) {
  proto::HttpUrl parsed;
  if (Status s = proto::parse_http_url(url, &parsed); !s.is_ok()) return s;
  if (timeout.count() <= 0) return Status(StatusCode::kOutOfRange, "health timeout must be positive");
  *out = HealthProbe(parsed.address, parsed.path.empty() ? "/health" : parsed.path, timeout);
  return Status::ok();
}

HealthProbeResult HealthProbe::probe() const {
  const Clock::time_point deadline = Clock::now() + timeout_;
  HealthProbeResult result;
  int raw_fd = -1;
  result.error = connect_with_deadline(address_, deadline, &raw_fd);
  if (!result.error.empty()) return result;
  Fd fd(raw_fd);
  const std::string request = "GET " + path_ + " HTTP/1.1\r\nHost: " + address_.to_string() +
                              "\r\nUser-Agent: pdnode\r\nAccept: */*\r\nConnection: close\r\n\r\n";
  result.error = send_all(fd.get(), request, deadline);
  if (!result.error.empty()) return result;
  return read_response(fd.get(), deadline);
}

}  // namespace pdr::sidecar
