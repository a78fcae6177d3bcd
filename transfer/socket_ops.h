// Socket set-up shared by the backends that speak TCP (the tcp backend's lanes, the rdma backend's
// control channel): address parsing and resolution, the listener, non-blocking connects and the
// per-socket options of T-8. Errors come back as Status (or -errno where a caller
// must tell EINPROGRESS/EAGAIN apart); nothing here throws.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"

namespace pdr::transfer {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

// "host:port" or "[v6]:port" -> host, port. kBadAddress on anything else (port 0 included).
Status split_host_port(std::string_view text, std::string* host, std::uint16_t* port);
// The inverse: brackets an IPv6 literal.
std::string join_host_port(std::string_view host, std::uint16_t port);

// getaddrinfo (may block on DNS): the first address of host:port.
Status resolve_address(const std::string& host, std::uint16_t port, SocketAddress* out);

// A non-blocking, close-on-exec listening socket (SO_REUSEADDR) bound to host:port; *bound_port is
// the real port (useful with port 0).
Status open_listener(const std::string& host, std::uint16_t port, int* fd, std::uint16_t* bound_port);

// Starts a non-blocking connect. Returns 0 (connected), -EINPROGRESS (watch for EPOLLOUT, then
// finish_connect()) or another -errno (no socket left open). *fd is set for 0 and -EINPROGRESS.
int start_connect(const SocketAddress& address, int* fd);
// After EPOLLOUT on a connecting socket: 0 or -errno (SO_ERROR).
int finish_connect(int fd);

// TCP_NODELAY (every frame is written whole, Nagle would only delay ACKs and READ_REQs).
void tune_socket(int fd);

}  // namespace pdr::transfer
