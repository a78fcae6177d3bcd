// TCP socket set-up that transfer/'s backends, node/ and the sidecar share: "host:port" text, name
// resolution, a listener, a non-blocking connect started and finished, and TCP_NODELAY. The calls
// that wait for the network, each bounded by a deadline, are transfer/net/blocking_socket.h; event
// loops (the tcp transfer backend's lanes) use the non-blocking pieces here directly.
//
// Errors come back as Status (or -errno where a caller must tell EINPROGRESS apart); nothing here
// throws. Every socket made here is close-on-exec and non-blocking. No shared state: any thread.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"

namespace pdr {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

// "host:port" or "[v6]:port" -> host, port. kBadAddress on anything else (port 0 included).
Status split_host_port(std::string_view text, std::string* host, std::uint16_t* port);
// The inverse: brackets an IPv6 literal.
std::string join_host_port(std::string_view host, std::uint16_t port);

// getaddrinfo for a stream socket (may block on DNS; no deadline covers it, so callers that must
// not wait pass IP literals). kBadAddress "cannot resolve '<host>': ..." when nothing resolves.
// Every address of host:port, in the resolver's order:
Status resolve_addresses(const std::string& host, std::uint16_t port, std::vector<SocketAddress>* out);
// The first of them:
Status resolve_address(const std::string& host, std::uint16_t port, SocketAddress* out);

// A listening socket (SO_REUSEADDR, backlog 512) bound to host:port; *bound_port is the real port
// (useful with port 0).
Status open_listener(const std::string& host, std::uint16_t port, int* fd, std::uint16_t* bound_port);

// Starts a connect, with TCP_NODELAY set first. Returns 0 (connected), -EINPROGRESS (wait for the
// socket to be writable, then finish_connect(); a connect a signal interrupted continues the same
// way) or another -errno (no socket left open). *fd is set for 0 and -EINPROGRESS.
int start_connect(const SocketAddress& address, int* fd);
// Once a connecting socket is writable: 0 or -errno (SO_ERROR).
int finish_connect(int fd);

// TCP_NODELAY: for callers that write whole messages and would only have Nagle delay them.
void set_tcp_nodelay(int fd);

}  // namespace pdr
