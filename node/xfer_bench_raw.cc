#include "node/xfer_bench_raw.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transfer/net/blocking_socket.h"
#include "transfer/net/tcp_socket.h"

namespace pdr::node::xfer_bench {

namespace {

Status io_error(const char* what) {
  return Status(StatusCode::kIoError, std::string(what) + ": " + std::strerror(errno));
}

void serve(int fd) {
  std::vector<char> scratch;
  for (;;) {
    std::uint8_t header[16];
    if (!recv_exact(fd, header, sizeof header, kNoDeadline)) break;
    std::uint64_t remaining = 0;
    std::uint64_t chunk = 0;
    for (int i = 7; i >= 0; --i) remaining = (remaining << 8) | header[i];
    for (int i = 15; i >= 8; --i) chunk = (chunk << 8) | header[i];
    // Receive in the sender's unit, as a receiver landing blocks in place would.
    scratch.resize(static_cast<std::size_t>(std::clamp<std::uint64_t>(chunk, 4096, 16u << 20)));
    bool ok = true;
    while (remaining > 0 && ok) {
      const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(remaining, scratch.size()));
      std::size_t n = 0;
      ok = recv_some(fd, scratch.data(), want, kNoDeadline, &n) && n > 0;
      remaining -= n;
    }
    const char ack = 1;
    if (!ok || !send_all(fd, &ack, 1, kNoDeadline)) break;
  }
  ::close(fd);
}

}  // namespace

RawSink::~RawSink() {
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (std::thread& t : connections_) t.join();
}

Status RawSink::start() {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return io_error("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return io_error("bind");
  if (::listen(listen_fd_, 16) != 0) return io_error("listen");
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
  return Status::ok();
}

void RawSink::accept_loop() {
  for (;;) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return;  // shut down
    }
    set_tcp_nodelay(fd);
    connections_.emplace_back(serve, fd);
  }
}

RawClient::~RawClient() {
  if (fd_ >= 0) ::close(fd_);
}

Status RawClient::connect(std::uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return io_error("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return io_error("connect");
  set_tcp_nodelay(fd_);
  return Status::ok();
}

Status RawClient::send_message(std::uint64_t total, std::uint64_t chunk) {
  if (buffer_.size() < chunk) buffer_.assign(chunk, std::byte{0x5a});
  std::uint8_t header[16];
  for (int i = 0; i < 8; ++i) header[i] = static_cast<std::uint8_t>(total >> (8 * i));
  for (int i = 0; i < 8; ++i) header[8 + i] = static_cast<std::uint8_t>(chunk >> (8 * i));
  if (Status s = send_all(fd_, header, sizeof header, kNoDeadline); !s) return s;
  for (std::uint64_t sent = 0; sent < total;) {
    const std::size_t n = static_cast<std::size_t>(std::min(chunk, total - sent));
    if (Status s = send_all(fd_, buffer_.data(), n, kNoDeadline); !s) return s;
    sent += n;
  }
  char ack = 0;
  return recv_exact(fd_, &ack, 1, kNoDeadline);
}

}  // namespace pdr::node::xfer_bench
