// The TCP backend of the transfer engine (TRANSFER.md 2.4, T-1 .. T-11): KV blocks move over L
// persistent loopback/network connections ("lanes") per peer, framed with proto/transfer_frame.h.
//
//   auto backend = make_tcp_backend({.listen_host = "0.0.0.0", .advertise_host = "10.0.0.7"});
//
// The returned object implements transfer/backend.h; that header is the contract. What this
// backend adds to it:
// - local_address() is "host:port" with the real bound port ("[::1]:port" for an IPv6 host).
// - can_reach() holds when the peer publishes a kTcp endpoint; add_peer() resolves its address
//   (the only place a DNS lookup may block) and connects nothing: each lane connects on the first
//   submit that uses it and introduces itself with a HELLO frame carrying our agent name.
// - A task whose segments span several pieces is striped over the lanes; a one-segment task stays
//   on one lane. A WRITE completes on the peer's ACK (sent once the bytes are in its memory), a
//   READ when every READ_DATA landed; a notify goes out only after that (T-10).
// - A lane that cannot connect retries with exponential backoff (50 ms doubling to 2 s) while work
//   waits for it; work that waited longer than connect_timeout fails kPeerGone.
// - Threads: min(lanes, cores) I/O threads, each with its own epoll loop; every other thread
//   reaches them only by posting commands. Callbacks (finish, on_notification) run on them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "transfer/backend.h"

namespace pdr::transfer {

struct TcpBackendOptions {
  std::string listen_host = "127.0.0.1";  // numeric IPv4/IPv6 address or a resolvable name
  std::uint16_t port = 0;                 // 0: any free port (see local_address())
  std::string advertise_host;             // published in local_address(); default listen_host
  std::uint32_t lanes = 0;                // connections per peer; 0: min(4, hardware cores)
  std::chrono::milliseconds connect_timeout{2000};  // per attempt, and how long work may wait
  std::uint64_t max_frame_payload = 64u << 20;      // larger incoming frames are bad frames
  std::size_t max_notification_bytes = 4096;        // larger incoming NOTIFY: bad frame
  std::size_t max_agent_bytes = 256;                // HELLO payload bound (both directions)
};

std::unique_ptr<Backend> make_tcp_backend(const TcpBackendOptions& options);

}  // namespace pdr::transfer
