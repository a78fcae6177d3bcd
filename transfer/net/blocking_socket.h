// Socket calls that wait, each bounded by a deadline on the steady clock: a TCP connect, sending a
// whole buffer, receiving exactly n bytes, receiving what arrives next. They serve the places that
// talk to one peer at a time on a thread of their own (the sidecar's health probe, the simulator's
// bootstrap GET, the rdma backend's handshake, xfer-bench's raw TCP ceiling); code on an event
// loop waits through its loop instead. Socket set-up is transfer/net/tcp_socket.h.
//
// Every call:
// - is bounded by `deadline` as a whole, however many syscalls it takes. A signal (EINTR)
//   restarts the wait with the time left, so it neither ends the call early nor extends it.
//   kNoDeadline waits as long as it takes. A deadline already past still completes what needs no
//   waiting (bytes already buffered, room already free).
// - works on a non-blocking socket (it waits in poll()). On a blocking socket a call with a
//   deadline passes MSG_DONTWAIT, so it cannot block past the deadline either; with kNoDeadline
//   the calls are plain blocking send()/recv().
// - never raises SIGPIPE (MSG_NOSIGNAL): writing to a peer that went away is an error.
// - fails with kIoError "<what>: <why>", why being "timed out", "closed by the peer ..." or the
//   errno text (what: "connect to host:port", "send", "receive").
//
// Threads: no shared state; any thread. Only the socket's owner should call, one call at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proto/base/status.h"
#include "proto/base/unique_fd.h"

namespace pdr {

using SocketClock = std::chrono::steady_clock;
inline constexpr SocketClock::time_point kNoDeadline = SocketClock::time_point::max();

// Waits until `fd` reports one of `events` (poll(2) flags; an error or hang-up also ends the wait,
// for the next call on the socket to report) or the deadline passes ("<what>: timed out").
Status wait_socket(int fd, short events, SocketClock::time_point deadline, std::string_view what);

// Resolves host:port (tcp_socket.h; the lookup itself is not bounded) and connects to each address
// in turn until one accepts, all by the deadline. *out is non-blocking, close-on-exec, with
// TCP_NODELAY.
Status connect_tcp(const std::string& host, std::uint16_t port, SocketClock::time_point deadline,
                   UniqueFd* out);

// Sends all `size` bytes, however the kernel splits them.
Status send_all(int fd, const void* data, std::size_t size, SocketClock::time_point deadline);
inline Status send_all(int fd, std::string_view bytes, SocketClock::time_point deadline) {
  return send_all(fd, bytes.data(), bytes.size(), deadline);
}

// Receives exactly `size` bytes into `out`. A peer that closes first is "receive: closed by the
// peer after <got> of <size> bytes" (what arrived is in `out`).
Status recv_exact(int fd, void* out, std::size_t size, SocketClock::time_point deadline);

// Waits for data and receives what is there, at most `capacity` (> 0) bytes; *received == 0
// means the peer closed (orderly shutdown).
Status recv_some(int fd, void* out, std::size_t capacity, SocketClock::time_point deadline,
                 std::size_t* received);

}  // namespace pdr
