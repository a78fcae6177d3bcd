// ResponseWriter: the handler's handle on the response to one request.
//
// Threading: every method must be called on the worker thread that ran the handler (reach it
// from elsewhere with Server::post(request.worker, ...)). The writer may be moved and stored; it
// stays valid memory-wise after the client has gone or the server has stopped (calls are then
// no-ops returning false), because it shares ownership of the connection state and checks a
// per-request sequence number before touching it.
//
// Exactly one of send() or start_stream()...end_stream() produces the response. Responses on one
// connection go out strictly in request order: the next pipelined request is not parsed until
// this one's response is complete.
//
// Dropping the last writer (destruction or move-assignment) before the response is complete:
// nothing sent yet -> the server answers 500 (OpenAI-style JSON); a stream in progress -> the
// connection is closed without the terminating chunk, so the client sees a truncated stream
// rather than a falsely complete one. on_client_close does not fire in that case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "router/http/http_message.h"

namespace pdr::http {

class HttpConnection;

class ResponseWriter {
 public:
  // on_drain fires when buffered_bytes() falls from at-or-above this mark to below it.
  static constexpr size_t kDrainLowWater = 64 * 1024;

  ResponseWriter() = default;
  ResponseWriter(ResponseWriter&& other) noexcept;
  ResponseWriter& operator=(ResponseWriter&& other) noexcept;
  ResponseWriter(const ResponseWriter&) = delete;
  ResponseWriter& operator=(const ResponseWriter&) = delete;
  ~ResponseWriter();

  // False for a default-constructed or moved-from writer.
  explicit operator bool() const { return conn_ != nullptr; }

  // Whole response with Content-Length. Returns false (and sends nothing) if a response was
  // already started or the client is gone.
  bool send(Response response);

  // Starts a streamed response: Transfer-Encoding: chunked for HTTP/1.1 clients; for HTTP/1.0
  // clients the body is close-delimited (Connection: close). Returns false if a response was
  // already started or the client is gone.
  bool start_stream(int status, std::vector<Header> headers);

  // Queues one chunk (copied). Empty chunks are ignored (they would terminate the stream).
  // Returns false if no stream is open or the client is gone. Never blocks: watch
  // buffered_bytes() and on_drain() for back-pressure.
  bool write(std::string_view chunk);

  // Terminating chunk; completes the response.
  void end_stream();

  // Closes the connection at once without sending anything more: no response if none started,
  // no terminating chunk if a stream is in progress (the client sees the connection end, as
  // when a server dies). on_client_close does not fire; the exchange is not counted as a client
  // abort. No-op if the response is complete or the client is gone.
  void abort();

  // Bytes handed to the socket but not yet flushed for this connection.
  size_t buffered_bytes() const;

  // Replaces the drain callback. Cleared when the response completes or the connection closes.
  void on_drain(std::function<void()> fn);

  // Fires at most once, on the worker thread, if the connection closes (client disconnect,
  // write error, server shutdown past its drain deadline) before the response is complete.
  // If the client is already gone when this is called, fires immediately.
  void on_client_close(std::function<void()> fn);

  // True once the connection is closed or closing because of the peer.
  bool client_gone() const;

 private:
  friend class HttpConnection;
  ResponseWriter(std::shared_ptr<HttpConnection> conn, uint64_t seq);
  void release();

  std::shared_ptr<HttpConnection> conn_;
  uint64_t seq_ = 0;
};

}  // namespace pdr::http
