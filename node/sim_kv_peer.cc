#include "node/sim_kv_peer.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "node/sim_dialect.h"

namespace pdr::node::sim {
namespace {

using Clock = std::chrono::steady_clock;

int millis_left(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 60000));
}

// Waits for `events` on fd until the deadline; false on timeout or error.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  while (true) {
    const int n = ::poll(&p, 1, millis_left(deadline));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::optional<std::string> http_get(const proto::HostPort& server, const std::string& path,
                                    Clock::time_point deadline, std::string* body) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(server.port);
  if (int rc = ::getaddrinfo(server.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return std::string("cannot resolve ") + server.host + ": " + ::gai_strerror(rc);
  }
  Fd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const int rc = fd.get() < 0 ? -1 : ::connect(fd.get(), found->ai_addr, found->ai_addrlen);
  ::freeaddrinfo(found);
  if (fd.get() < 0) return std::string("socket: ") + std::strerror(errno);
  if (rc != 0 && errno != EINPROGRESS) return std::string("connect: ") + std::strerror(errno);
  if (!wait_fd(fd.get(), POLLOUT, deadline)) return std::string("connect: deadline passed");
  int err = 0;
  socklen_t len = sizeof(err);
  ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) return std::string("connect: ") + std::strerror(err);

  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: " + server.to_string() + "\r\nConnection: close\r\n\r\n";
  size_t sent = 0;
  while (sent < request.size()) {
    if (!wait_fd(fd.get(), POLLOUT, deadline)) return std::string("send: deadline passed");
    const ssize_t n = ::send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) return std::string("send: ") + std::strerror(errno);
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string answer;
  char buf[16384];
  while (true) {
    if (!wait_fd(fd.get(), POLLIN, deadline)) return std::string("no answer before the deadline");
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return std::string("recv: ") + std::strerror(errno);
    }
    answer.append(buf, static_cast<size_t>(n));
    if (answer.size() > (1u << 20)) return std::string("answer larger than 1 MiB");
  }
  const size_t head_end = answer.find("\r\n\r\n");
  if (head_end == std::string::npos || !answer.starts_with("HTTP/1.")) {
    return std::string("not an HTTP answer");
  }
  const size_t space = answer.find(' ');
  if (answer.compare(space + 1, 3, "200") != 0) {
    return "HTTP status " + answer.substr(space + 1, 3);
  }
  // The sim's server may answer chunked even to HTTP/1.0; de-chunk when it says so.
  const std::string head = answer.substr(0, head_end);
  std::string raw = answer.substr(head_end + 4);
  std::string lower;
  for (char c : head) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower.find("transfer-encoding: chunked") == std::string::npos) {
    *body = std::move(raw);
    return std::nullopt;
  }
  body->clear();
  size_t pos = 0;
  while (true) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) return std::string("truncated chunked body");
    const size_t size = std::strtoul(raw.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (size == 0) return std::nullopt;
    if (eol + 2 + size > raw.size()) return std::string("truncated chunk");
    body->append(raw, eol + 2, size);
    pos = eol + 2 + size + 2;
  }
}

SimError kv_peer_error(std::string message) {
  return SimError{502, "kv_peer_unreachable", std::move(message)};
}

std::optional<SimError> resolve_kv_peer(const SimDialect& dialect, const KvBlocks& blocks,
                                        Clock::time_point deadline, proto::HostPort* out) {
  if (blocks.peer_address.empty()) {
    return kv_peer_error("the request does not say where the prefill's KV is (no peer address)");
  }
  return dialect.resolve_peer(blocks, deadline, out);
}

}  // namespace pdr::node::sim
