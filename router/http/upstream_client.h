// Upstream HTTP/1.1 client: how a worker calls prefill/decode nodes (vLLM's OpenAI server).
//
// One UpstreamPool per worker loop keeps keep-alive connections per upstream address
// ("host:port"); start() sends one request and streams the response back through callbacks.
//
// Threading: everything here (constructor, start(), cancel(), pause(), resume(), close_all(),
// stats(), destructor) runs on the thread running the pool's loop, and every callback fires on
// that thread. Other threads reach it only by posting onto the loop (Server::post).
//
// Callbacks (UpstreamCallbacks) for one call, in order:
//   on_head once (final response status and headers; 1xx interim responses are skipped, up to
//   kMaxInterimResponses; a head over kMaxResponseHeaderBytes or kMaxResponseHeaders fails the
//   call with kBadResponse before on_head),
//   on_body zero or more times with de-chunked body bytes as they arrive (no buffering: an SSE
//   event reaches on_body when its bytes are read), then exactly one of on_complete / on_error.
//   on_error may also come before on_head (connect refused, timeouts, reset, parse error).
//   No callback ever runs inside start(): failures found there (bad address, a header with
//   CR/LF, the pool already closed) are reported from the loop on its next iteration.
//   After cancel() (or once the call is done) no callback fires again. Callbacks may call
//   cancel(), pause(), resume() and start() freely; exceptions they throw are caught and logged
//   (they never cross libuv), and a throwing callback cancels its call. The four are released
//   together (the call done or cancelled), never while one of them runs.
//
// Connection reuse: a connection goes back to the pool only after a complete response whose
// framing allows reuse (llhttp_should_keep_alive: HTTP/1.1 without "Connection: close", body
// delimited by Content-Length or chunking) with no error and no extra bytes after it. Idle
// pooled connections keep reading so a close by the upstream removes them at once; one found
// closed only when reused (EOF, reset or write error before any byte of the response) is
// retried transparently ONCE on a fresh connection. The retry is safe because vLLM saw at most a
// request on a connection it had already decided to close; it never happens once a response
// byte was received, never on a fresh connection, and never twice for one call.
//
// Addresses: IPv4 and IPv6 literals (HostPort::host without brackets) are used as they are.
// Hostnames are resolved off the loop (HostResolver: one lookup per name per dns_ttl, IPv4 first,
// looked up again after a failed connect); a name that does not resolve fails the call with
// kConnect ("connect to host:port: cannot resolve 'host': ..."). Resolution has its own
// timeout (resolve_timeout) before the connect timeout starts.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/address.h"
#include "proto/base/status.h"
#include "router/http/http_message.h"

struct uv_loop_s;

namespace pdr::http {

class TlsClientContext;

namespace detail {
class UpstreamConnection;
struct UpstreamPoolCore;
}  // namespace detail

struct UpstreamRequest {
  std::string method = "POST";
  std::string path = "/";  // request-target, e.g. "/v1/completions"
  // Sent as given, except Host, Content-Length, Transfer-Encoding, Connection and Keep-Alive,
  // which the client writes itself (Host: target, Content-Length: body size,
  // Connection: keep-alive).
  std::vector<Header> headers;
  // Sent after `headers`, by the same rules; read only inside UpstreamPool::start() (like
  // append_body), so they may point at the caller's own storage (the router's legs).
  std::span<const std::pair<std::string, std::string>> borrowed_headers;
  std::string body;
  // Instead of `body` (then left empty): appends exactly body_size bytes to the wire buffer, so
  // a body assembled from pieces (the router's unrendered legs) is copied once, into the bytes
  // that go to the socket. Called at most once, inside UpstreamPool::start(); a wrong size fails
  // the call with kBadRequest.
  std::function<void(std::string* wire)> append_body;
  size_t body_size = 0;
  // true: on_head gets the response's Content-Type header only (if any), the others are not
  // copied out of the read buffer (the parser reads the framing headers itself either way; the
  // head limits count every header). For callers that read nothing else (the router's legs).
  bool only_content_type = false;
  // Set: this call speaks TLS with this context (over PoolOptions::tls), on connections of its
  // own (a pooled connection is reused only by calls to the same target with the same context).
  // Null: the pool's choice. See PoolOptions::tls for what TLS changes.
  std::shared_ptr<const TlsClientContext> tls;
};

struct UpstreamCallbacks {
  std::function<void(int status, const std::vector<Header>& headers)> on_head;
  std::function<void(std::string_view chunk)> on_body;  // the view is valid during the call only
  std::function<void()> on_complete;
  std::function<void(const Status& error)> on_error;
  // Held with the four and released with them: what they need alive (the caller's session)
  // without capturing an owning pointer, which a std::function would put on the heap.
  std::shared_ptr<void> keep_alive;
};

// Zero disables a timeout.
struct UpstreamTimeouts {
  std::chrono::milliseconds connect{2000};     // TCP connect (fresh connections only)
  std::chrono::milliseconds first_byte{60000};  // request written -> first response byte
  std::chrono::milliseconds idle{60000};        // between response reads; stopped while paused
};

// Why a call failed; finer than the Status code (see UpstreamCall::failure()).
enum class UpstreamFailure {
  kNone,
  kBadRequest,        // invalid address or request (kBadAddress / kInvalidValue)
  kConnect,           // connect failed (refused, unreachable)           kIoError
  kConnectTimeout,    //                                                   kIoError
  kFirstByteTimeout,  //                                                   kIoError
  kIdleTimeout,       //                                                   kIoError
  kConnectionLost,    // EOF/reset/write error before the response was complete  kIoError
  kBadResponse,       // llhttp rejected the response, or it is over a limit  kMalformed
  kPoolClosed,        // close_all() or pool destruction                   kIoError
  // This process could not create the socket (EMFILE, ENFILE, ENOBUFS, ENOMEM): a local
  // shortage, not the node's fault (never count it against the node).      kIoError
  kLocalResources,
};

// Limits on an upstream response head: over one the call fails with kBadResponse
// ("response from HOST:PORT refused: ..."). The header block is buffered whole before on_head,
// so without them a node could make the router buffer without bound.
inline constexpr size_t kMaxResponseHeaderBytes = 64 * 1024;  // names + values, per response head
inline constexpr size_t kMaxResponseHeaders = 100;
inline constexpr size_t kMaxInterimResponses = 10;  // 1xx heads before the final one

// True for the three timeout kinds.
bool is_timeout(UpstreamFailure failure);

struct PoolOptions {
  // Idle keep-alive connections kept per address. Every connection that finishes a response
  // goes back to the pool up to this cap and the excess is closed, so the cap must exceed the
  // concurrency one worker sends to one node: a low cap (it was 32) made pdrouter reconnect
  // for most legs at 100 concurrent requests (bench/router/RESULTS.md).
  size_t max_idle_per_host = 1024;
  // An idle pooled connection is closed after this. Kept below vLLM's (uvicorn's) 5 s
  // keep-alive timeout so that pdrouter, not the node, closes idle connections; the retry-once
  // path covers the remaining race.
  std::chrono::milliseconds idle_timeout{4000};
  // Upstreams named by hostname: how long a resolved address is used before the name is looked
  // up again, and how long a lookup may take.
  std::chrono::milliseconds dns_ttl{5000};
  std::chrono::milliseconds resolve_timeout{2000};
  // Set: every connection of this pool speaks TLS (router/http/tls_client.h) to its upstream, the peer
  // checked against the context's server_name or else the target's host; the connect timeout
  // then covers the TCP connect and the TLS handshake. A handshake that fails (certificate not
  // verified, protocol) fails the call with kConnect and a "tls: ..." message, counted in
  // tls_error_count(). Null (the default): plain TCP, no TLS code runs, unless a call brings its
  // own context (UpstreamRequest::tls: the legs to nodes with connectors.tls).
  std::shared_ptr<const TlsClientContext> tls;
};

// Counters since construction. Plain values: read on the loop thread.
struct PoolStats {
  uint64_t connects = 0;  // fresh connections attempted
  uint64_t reuses = 0;    // calls started on a pooled connection
  uint64_t retries = 0;   // stale pooled connection -> retried on a fresh one
  uint64_t errors = 0;    // calls that ended in on_error
  uint64_t timeouts = 0;  // of which timeouts
  uint64_t cancels = 0;   // calls cancelled while in flight
  uint64_t active = 0;    // calls in flight (gauge)
  uint64_t idle = 0;      // pooled idle connections (gauge)
  uint64_t name_lookups = 0;  // hostnames looked up (cache misses; concurrent calls share one)
  uint64_t oversized_heads = 0;  // responses refused for a response-head limit (above)
  uint64_t local_errors = 0;     // calls failed with kLocalResources
};

// What a caller may do with a call in flight (UpstreamCall's methods below), as an interface: a
// layer above that drives calls through a seam (router/proxy/upstream_port.h) and its fakes in
// tests share it, so the pool's own handle is passed on without an adapter per call.
class UpstreamCallControl {
 public:
  virtual ~UpstreamCallControl() = default;
  virtual void cancel() = 0;
  virtual void pause() = 0;
  virtual void resume() = 0;
  virtual UpstreamFailure failure() const = 0;
  virtual bool reused_connection() const = 0;
};

// Handle on one call. Holding it is optional: an unreferenced call still runs to completion.
class UpstreamCall final : public UpstreamCallControl {
  struct Key {
    explicit Key() = default;
  };

 public:
  // UpstreamPool::start() only (the key is private); the callbacks are moved in once.
  UpstreamCall(Key, UpstreamCallbacks&& callbacks) : callbacks_(std::move(callbacks)) {}
  UpstreamCall(const UpstreamCall&) = delete;
  UpstreamCall& operator=(const UpstreamCall&) = delete;
  ~UpstreamCall() override;

  // Closes the connection at once (the upstream sees the close: that is how vLLM is told to
  // abort) and suppresses every later callback. No-op once the call is done.
  void cancel() override;
  // Back-pressure: stop / restart reading the response. While paused the idle timeout is
  // stopped. Bytes already read (at most one 64 KiB read) may still reach on_body after pause().
  void pause() override;
  void resume() override;

  // True once on_complete / on_error fired or cancel() ran.
  bool done() const { return state_ == State::kDone; }
  UpstreamFailure failure() const override { return failure_; }
  // The call currently runs (or ran) on a connection taken from the pool.
  bool reused_connection() const override { return reused_; }
  // A stale pooled connection was replaced by a fresh one (see the header comment).
  bool retried() const { return retried_; }

 private:
  friend class UpstreamPool;
  friend class detail::UpstreamConnection;
  friend struct detail::UpstreamPoolCore;
  enum class State { kPending, kRunning, kDone };

  // Runs one user callback: exceptions are caught and logged (and cancel the call); callbacks
  // are released once the call is done and no callback of it is on the stack.
  template <typename Fn, typename... Args>
  void fire(Fn& fn, const char* what, Args&&... args);
  void end(bool cancelled, bool error);  // state and stats bookkeeping
  void finish_ok();
  void finish_error(UpstreamFailure failure, Status error);

  std::weak_ptr<detail::UpstreamPoolCore> core_;
  proto::HostPort target_;
  std::string key_;   // target_.to_string()
  // The TLS context of this call (UpstreamRequest::tls, else PoolOptions::tls; null: plain) and
  // the key of its idle connections: key_ (pool_key_ empty), or key_ plus the identity of a
  // per-call context.
  std::shared_ptr<const TlsClientContext> tls_;
  std::string pool_key_;
  const std::string& pool_key() const { return pool_key_.empty() ? key_ : pool_key_; }
  // Serialized request, kept for the one retry; released once a response byte arrived and the
  // write completed (the retry is never allowed after that), or when the call ends.
  std::string wire_;
  UpstreamTimeouts timeouts_;
  UpstreamCallbacks callbacks_;
  State state_ = State::kPending;
  UpstreamFailure failure_ = UpstreamFailure::kNone;
  Status pending_error_;  // reported from the deferred queue (see start())
  detail::UpstreamConnection* conn_ = nullptr;
  bool only_content_type_ = false;  // UpstreamRequest::only_content_type
  bool reused_ = false;
  bool retried_ = false;
  bool paused_ = false;
  int in_callback_ = 0;
};

class UpstreamPool {
 public:
  UpstreamPool(uv_loop_s* loop, PoolOptions options = {});
  // close_all(), then releases the loop's handles; they finish closing the next time the loop
  // runs (run it until uv_loop_alive() is false before uv_loop_close()).
  ~UpstreamPool();
  UpstreamPool(const UpstreamPool&) = delete;
  UpstreamPool& operator=(const UpstreamPool&) = delete;

  // Starts one request to `target`, on a pooled connection if one is idle, else a fresh one.
  // Never calls back synchronously. Returns the call's handle (never null).
  std::shared_ptr<UpstreamCall> start(const proto::HostPort& target, UpstreamRequest&& request,
                                      UpstreamTimeouts timeouts, UpstreamCallbacks&& callbacks);

  // Shutdown: closes idle and active connections; active calls get on_error (kPoolClosed)
  // synchronously from here. Later start() calls fail the same way (from the loop).
  void close_all();

  PoolStats stats() const;

 private:
  std::shared_ptr<detail::UpstreamPoolCore> core_;
};

}  // namespace pdr::http
