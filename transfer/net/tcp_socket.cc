// TCP socket set-up (contract: tcp_socket.h).
#include "transfer/net/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace pdr {

Status split_host_port(std::string_view text, std::string* host, std::uint16_t* port) {
  std::string_view host_part;
  std::string_view port_part;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return Status(StatusCode::kBadAddress, "address '" + std::string(text) + "' is not [host]:port");
    }
    host_part = text.substr(1, close - 1);
    port_part = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || text.find(':') != colon) {
      return Status(StatusCode::kBadAddress, "address '" + std::string(text) + "' is not host:port");
    }
    host_part = text.substr(0, colon);
    port_part = text.substr(colon + 1);
  }
  unsigned value = 0;
  const auto [end, ec] = std::from_chars(port_part.data(), port_part.data() + port_part.size(), value);
  if (host_part.empty() || ec != std::errc() || end != port_part.data() + port_part.size() ||
      value == 0 || value > 65535) {
    return Status(StatusCode::kBadAddress, "address '" + std::string(text) + "' has no valid host and port");
  }
  host->assign(host_part);
  *port = static_cast<std::uint16_t>(value);
  return {};
}

std::string join_host_port(std::string_view host, std::uint16_t port) {
  std::string out;
  if (host.find(':') != std::string_view::npos) {
    out.append("[").append(host).append("]");
  } else {
    out.append(host);
  }
  return out + ":" + std::to_string(port);
}

Status resolve_addresses(const std::string& host, std::uint16_t port, std::vector<SocketAddress>* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return Status(StatusCode::kBadAddress, "cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  out->clear();
  for (const addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    SocketAddress& address = out->emplace_back();
    std::memcpy(&address.storage, ai->ai_addr, ai->ai_addrlen);
    address.length = ai->ai_addrlen;
  }
  freeaddrinfo(result);
  return {};
}

Status resolve_address(const std::string& host, std::uint16_t port, SocketAddress* out) {
  std::vector<SocketAddress> all;
  if (Status status = resolve_addresses(host, port, &all); !status) return status;
  *out = all.front();
  return {};
}

Status open_listener(const std::string& host, std::uint16_t port, int* fd, std::uint16_t* bound_port) {
  SocketAddress address;
  if (Status status = resolve_address(host, port, &address); !status) return status;
  const int sock = ::socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sock < 0) return Status(StatusCode::kIoError, std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(sock, reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0 ||
      ::listen(sock, 512) != 0) {
    const int err = errno;
    ::close(sock);
    return Status(StatusCode::kIoError,
                  "cannot listen on " + join_host_port(host, port) + ": " + std::strerror(err));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  ::getsockname(sock, reinterpret_cast<sockaddr*>(&bound), &length);
  *bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                  : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  *fd = sock;
  return {};
}

int start_connect(const SocketAddress& address, int* fd) {
  const int sock = ::socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sock < 0) return -errno;
  set_tcp_nodelay(sock);
  if (::connect(sock, reinterpret_cast<const sockaddr*>(&address.storage), address.length) == 0) {
    *fd = sock;
    return 0;
  }
  const int err = errno;
  // After EINTR the connect carries on in the background (connect(2)): the same wait applies.
  if (err == EINPROGRESS || err == EINTR) {
    *fd = sock;
    return -EINPROGRESS;
  }
  ::close(sock);
  return -err;
}

int finish_connect(int fd) {
  int err = 0;
  socklen_t length = sizeof err;
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &length) != 0) return -errno;
  return -err;
}

void set_tcp_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace pdr
