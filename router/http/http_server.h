// pdrouter's HTTP/1.1 front door: N worker threads, each with its own libuv loop and its own
// SO_REUSEPORT listening socket on the same port (the kernel spreads connections over them).
// start() first binds the port once without SO_REUSEPORT, so a port any other socket listens
// on (a second pdrouter, or anything with SO_REUSEPORT) is refused instead of shared.
//
// Contracts:
// - The handler runs on a worker thread, once per request, in request order per connection. It
//   is shared by all workers, so it must be safe to call concurrently from different workers.
//   It must not block the loop; long work continues through the ResponseWriter later, from the
//   same worker thread (Server::post is the way back onto it).
// - Errors the server detects itself are answered with OpenAI-style JSON (error_response) and
//   the connection is closed: parse error 400, header read timeout 408, body too large 413
//   (decided from Content-Length before the body is read), headers too large 431, handler threw
//   or dropped its writer 500, 503 memory_budget (Retry-After: 1) when ServerOptions::body_budget
//   refuses the body (body_budget.h; decided from Content-Length before the body is read too).
// - Timers: a new connection, or a keep-alive connection once the first byte of its next request
//   arrives, must deliver complete headers within header_read_timeout (then 408). Once the
//   headers are complete the whole body must arrive within body_read_timeout, counted from the
//   end of the headers however often bytes trickle in (then 408). A keep-alive connection with
//   no bytes for keep_alive_idle is closed silently; that idle time starts only once the last
//   response has been fully written. While response bytes are still queued the connection is
//   instead closed when its output makes no progress for keep_alive_idle.
// - Output back-pressure: while a connection has kOutputHighWater bytes or more queued for the
//   client, it neither reads nor parses more requests (a pipelining client that never reads
//   cannot make the server render answers without bound); both resume once the queue drains.
// - A client that closes its connection (EOF) while its response is pending counts as gone:
//   the writer's on_client_close fires. That is what lets the router abort upstream legs.
// - TLS (ServerOptions::tls): every connection starts with a TLS handshake (router/http/tls_server.h),
//   which must end within header_read_timeout with the first request's headers (a slow handshake
//   is a slow header: the connection is closed, counted as a tls timeout). After it the
//   connection behaves as on plain TCP (the same timers, keep-alive, streaming, back-pressure,
//   kOutputHighWater counted in plaintext bytes). Failed handshakes are counted by reason
//   (ServerStats::tls_failures) and closed; plain HTTP sent to the port gets a plain-text 400.
//   set_tls() replaces the context for later handshakes; open connections keep theirs.
// - No libuv types here; loop() exposes the worker's loop as an opaque pointer for the upstream
//   client, which lives on the same threads.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "proto/base/status.h"
#include "router/http/http_message.h"
#include "router/http/json_error.h"
#include "router/http/response_writer.h"
#include "router/http/tls_server.h"

struct uv_loop_s;

namespace pdr::http {

using Handler = std::function<void(Request&&, ResponseWriter)>;

struct ServerOptions {
  std::string host = "0.0.0.0";  // IPv4 or IPv6 literal
  uint16_t port = 0;             // 0: ephemeral, see Server::port()
  uint32_t workers = 1;
  size_t max_header_bytes = 64 * 1024;         // request line + headers
  size_t max_body_bytes = 32 * 1024 * 1024;    // decoded body
  std::chrono::milliseconds header_read_timeout{10000};
  std::chrono::milliseconds body_read_timeout{30000};  // whole body, from the end of the headers
  std::chrono::milliseconds keep_alive_idle{60000};
  // Across all workers; excess is accepted, answered 503 (Retry-After: 1) and closed at once.
  uint32_t max_connections = 16384;
  int backlog = 1024;
  // Request bodies are charged to it as they are buffered (body_budget.h); null: no budget.
  // Must outlive the server.
  BodyBudget* body_budget = nullptr;
  // Runs on each worker's own thread during stop(), after its connections are closed and before
  // its loop ends: the place to release per-worker state holding handles on that loop (upstream
  // pools, timers). Optional.
  std::function<void(uint32_t worker)> on_worker_stop;
  // Set: the listener speaks TLS with this context (see the header comment). Null: plain TCP.
  std::shared_ptr<const TlsServerContext> tls;
};

// Counters, updated by workers with relaxed atomics; read from any thread.
struct ServerStats {
  std::atomic<uint64_t> connections_accepted{0};
  std::atomic<uint64_t> connections_rejected{0};  // over max_connections
  // Connections answered 503 (Retry-After: 1) and closed at once: over max_connections, or
  // accepted into the reserve descriptor when the process had no descriptor left.
  std::atomic<uint64_t> busy_refusals{0};
  std::atomic<uint64_t> connections_active{0};    // gauge
  std::atomic<uint64_t> requests{0};              // dispatched to the handler
  std::array<std::atomic<uint64_t>, 6> responses_by_class{};  // [1]=1xx ... [5]=5xx; [0] unused
  std::atomic<uint64_t> bad_requests{0};          // 400 from the parser
  std::atomic<uint64_t> header_too_large{0};      // 431
  std::atomic<uint64_t> body_too_large{0};        // 413
  std::atomic<uint64_t> header_timeouts{0};       // 408 (headers)
  std::atomic<uint64_t> body_timeouts{0};         // 408 (body_read_timeout)
  std::atomic<uint64_t> idle_timeouts{0};         // keep-alive idle closes
  std::atomic<uint64_t> client_aborts{0};         // client gone with a response pending
  std::atomic<uint64_t> handler_errors{0};        // handler threw or dropped its writer
  std::atomic<uint64_t> output_pauses{0};         // reading stopped: kOutputHighWater queued
  std::atomic<uint64_t> output_buffered_bytes{0};  // gauge: response bytes queued, all connections
  std::atomic<uint64_t> write_stalls{0};          // closed: queued output made no progress
  std::atomic<uint64_t> output_writes{0};  // writes to client sockets: one per connection per loop turn
  std::atomic<uint64_t> accept_errors{0};         // accept() failed (EMFILE, ENFILE, ...)
  std::atomic<uint64_t> tls_handshakes{0};        // TLS listeners: handshakes completed
  std::array<std::atomic<uint64_t>, static_cast<size_t>(TlsFailure::kCount)> tls_failures{};  // by reason
};

// Queued response bytes above which a connection stops reading and parsing requests.
inline constexpr size_t kOutputHighWater = 256 * 1024;

class Server {
 public:
  Server();
  ~Server();  // stop(0ms) if still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds every worker's listener (port 0: worker 0 picks the port, the others bind it too),
  // then starts the worker threads. Returns once all workers listen. Call once.
  Status start(const ServerOptions& options, Handler handler);

  // Bound port; valid after a successful start().
  uint16_t port() const;
  uint32_t workers() const;

  // Runs `fn` on worker `worker`'s loop thread, in posting order. Thread-safe. If the server is
  // not running (or worker is out of range) `fn` is destroyed without running.
  void post(uint32_t worker, std::function<void()> fn);

  // Thread-safe and idempotent; must not be called from a worker thread. Stops accepting
  // (listeners closed: new connections are refused), closes idle keep-alive connections, lets
  // in-flight requests finish (their responses carry Connection: close) for up to `drain`, then
  // closes everything (pending writers see on_client_close) and joins the threads.
  void stop(std::chrono::milliseconds drain);

  const ServerStats& stats() const;

  // Thread-safe. A server started with ServerOptions::tls: connections accepted from now on
  // handshake with `tls` (null is ignored); open ones keep the context they started with. No-op
  // on a plain server (TLS cannot be turned on or off while running).
  void set_tls(std::shared_ptr<const TlsServerContext> tls);
  // The context new connections get (null on a plain server).
  std::shared_ptr<const TlsServerContext> tls() const;

  // The worker's uv_loop_t, for code that runs on that worker (e.g. upstream clients). Valid
  // between start() and stop().
  uv_loop_s* loop(uint32_t worker) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdr::http
