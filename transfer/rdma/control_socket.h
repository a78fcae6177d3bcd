// The RDMA backend's out-of-band control channel: a small TCP socket per connection that carries
// one length-prefixed handshake record each way (proto/rdma_handshake.h) and then stays open as
// the liveness signal of the QPs it set up (EOF = the peer or its QPs are gone).
//
// docs/design/kv-transfer.md R-4 suggests this exchange on the TCP backend's port; backends are built and linked
// independently (pdr_transfer_rdma links only the core), so the RDMA backend listens on its own
// control port instead. Merging them needs a hook in backend.h.
//
// Every call takes a deadline and never blocks past it (transfer/net/blocking_socket.h). All fds are
// close-on-exec. Called by the connector and control threads, without the backend lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "proto/base/status.h"

namespace pdr::transfer::rdma {

using ControlClock = std::chrono::steady_clock;

// The listener is transfer/net/tcp_socket.h open_listener (non-blocking, port 0: any).
// Connects to "host:port" (the host may be [v6]) by the deadline. The returned fd is
// non-blocking, with TCP_NODELAY; the record calls below wait with poll.
Status control_connect(const std::string& address, ControlClock::time_point deadline, int* fd);
// Sends a u32 little-endian length prefix and the bytes.
Status control_send_record(int fd, const std::string& record, ControlClock::time_point deadline);
// Receives one record of at most max_bytes (kTooLarge beyond; kIoError on EOF/timeout).
Status control_recv_record(int fd, std::size_t max_bytes, ControlClock::time_point deadline,
                           std::string* record);

}  // namespace pdr::transfer::rdma
