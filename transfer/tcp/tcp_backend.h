// The TCP backend of the transfer engine (docs/design/kv-transfer.md, T-1 .. T-11): KV blocks move over L
// persistent loopback/network connections ("lanes") per peer, framed with proto/transfer_frame.h.
//
//   auto backend = make_tcp_backend({.listen_host = "0.0.0.0", .advertise_host = "10.0.0.7"});
//
// The returned object implements transfer/backend.h; that header is the contract. What this
// backend adds to it:
// - local_address() is "host:port" with the real bound port ("[::1]:port" for an IPv6 host).
// - can_reach() holds when the peer publishes a kTcp endpoint; add_peer() resolves its address
//   (the only place a DNS lookup may block) and connects nothing: each lane connects on the first
//   submit that uses it and introduces itself with a HELLO frame carrying our agent name and its
//   proof (below). add_peer() refuses a descriptor without a secret (kRejected).
// - Trust model: the lanes are authenticated, not encrypted. Each engine has a random 32-byte
//   secret (BackendContext::secret, published in its descriptor). On accept the serving side sends
//   CHALLENGE (a fresh random nonce); the client must answer with HELLO carrying
//   HMAC-SHA256(server secret, nonce + client agent name) (proto/transfer_frame.h), checked in
//   constant time (libsodium). Until then no frame but that HELLO is read and nothing else is
//   answered; a missing or wrong proof, or any other frame first, closes the connection and counts
//   auth_failures, with nothing sent back. So only holders of this engine's descriptor (the peers
//   the router or the side channel gave it to) can read or write its regions: treat descriptors as
//   secrets, and keep the network private or wrap it (TLS/WireGuard) if the bytes themselves, or the
//   client's view of who the server is, must be protected (a client does not authenticate the
//   server).
// - Serving limits: an accepted connection that has not authenticated within hello_timeout is
//   closed (hello_timeouts); at most max_connections serving connections exist at once, and an
//   accept beyond that is closed at once (connections_refused). Before authentication a connection
//   holds no payload buffers (the 256 KiB drain buffer is allocated on the first refused WRITE).
//   Device regions (MemKind::kDevice) are never served: a READ/WRITE naming one is refused like an
//   out-of-bounds access (ERROR kAccess, access_refused).
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
  std::size_t max_agent_bytes = 256;                // HELLO agent name bound (both directions)
  std::chrono::milliseconds hello_timeout{2000};    // accept -> authenticated HELLO, or closed
  std::size_t max_connections = 256;                // serving connections at once (>= 1)
};

std::unique_ptr<Backend> make_tcp_backend(const TcpBackendOptions& options);

}  // namespace pdr::transfer
