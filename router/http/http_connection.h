// One accepted HTTP/1.1 connection: llhttp glue that turns bytes into Request structs, the
// response framing, and the connection's timers (internal to router/http/; the only place with
// llhttp callbacks).
//
// Ownership: the connection owns a self-reference from accept until its tcp handle's close
// callback; each ResponseWriter holds another. Memory is freed when both are gone. All methods
// run on the owning worker's thread.
#pragma once

#include <llhttp.h>
#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "router/http/http_message.h"
#include "router/http/http_server.h"
#include "router/http/response_writer.h"
#include "router/http/tls_server.h"
#include "router/http/uv_handle.h"

namespace pdr::http {

class HttpWorker;
class TlsSession;

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  explicit HttpConnection(HttpWorker& worker);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // Takes over `fd`, a client connection the worker accepted (non-blocking). Returns a negative
  // errno on failure, having closed `fd`.
  int open(int fd);
  // Graceful shutdown: close now if idle, else close after the current response.
  void begin_drain();
  // Closes immediately (pending writer sees on_client_close).
  void close_now();

  // ResponseWriter entry points; `seq` identifies the request the writer was made for.
  bool writer_send(uint64_t seq, Response&& response);
  bool writer_start_stream(uint64_t seq, int status, std::vector<Header>&& headers);
  bool writer_write(uint64_t seq, std::string_view chunk);
  void writer_end_stream(uint64_t seq);
  size_t writer_buffered_bytes(uint64_t seq) const;
  void writer_on_drain(uint64_t seq, std::function<void()> fn);
  void writer_on_client_close(uint64_t seq, std::function<void()> fn);
  bool writer_client_gone(uint64_t seq) const;
  void writer_dropped(uint64_t seq);
  void writer_abort(uint64_t seq);

  // Writes the bytes queued this loop turn (HttpWorker::schedule_flush): as much as the socket
  // takes at once, the rest through uv_write.
  void flush_output();

 private:
  enum class Phase {
    kReading,     // waiting for / parsing a request
    kDispatched,  // the handler owns the exchange; later input is buffered, not parsed
    kFinishing,   // last response queued; shutdown once flushed
    kLingering,   // write side shut down; discarding input until EOF or the linger timer
    kClosed,
  };
  enum class ResponseState { kNone, kStreaming, kDone };
  // kFlush: between requests while response bytes are still queued (the idle time has not
  // started, or parsing waits for the output to drain): closes when the output stalls.
  enum class TimerMode { kNone, kIdle, kHeaders, kBody, kLinger, kFlush };

  // libuv callbacks
  static void on_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
  static void on_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
  static void on_write(uv_write_t* req, int status);
  static void on_shutdown(uv_shutdown_t* req, int status);
  static void on_timer(uv_timer_t* t);
  // llhttp callbacks
  static int on_message_begin(llhttp_t* p);
  static int on_url(llhttp_t* p, const char* at, size_t len);
  static int on_header_field(llhttp_t* p, const char* at, size_t len);
  static int on_header_value(llhttp_t* p, const char* at, size_t len);
  static int on_headers_complete(llhttp_t* p);
  static int on_body(llhttp_t* p, const char* at, size_t len);
  static int on_message_complete(llhttp_t* p);
  static const llhttp_settings_t* parser_settings();

  void handle_read(ssize_t nread, const uv_buf_t* buf);
  // One read's plaintext (decrypted on a TLS listener).
  void handle_input(const char* data, size_t len);
  // TLS listeners: one socket read (ciphertext) through the handshake or the session, its
  // plaintext to handle_input; whatever the session has to send goes out (send_ciphertext).
  void handle_tls_read(ssize_t nread, const uv_buf_t* buf);
  void tls_handshake_failed(TlsFailure failure, const std::string& detail);
  // Writes `data` (encrypted first on a TLS listener) behind what is queued: returns how many of
  // its bytes (plaintext) the kernel took at once; the rest goes through uv_write, whose
  // completion credits them (output_taken). On failure *failed is set and all of `data` is
  // released from buffered_ (the caller closes).
  size_t write_out(std::string&& data, bool* failed);
  // Handshake messages, alerts and close_notify: written behind queued output, not counted in
  // buffered_ (they are the session's, not the response's).
  void send_ciphertext(std::string bytes);
  void process_input();
  void dispatch();
  bool add_header_bytes(size_t n);
  int fail_parse(int status, const char* reason);
  void send_error_and_close(int status, std::string_view message, std::string_view type,
                            std::string_view code, bool retry_after = false);
  void begin_next_request();
  void finish_response();
  void begin_close_after_flush();
  void start_lingering();
  void arm_timer(TimerMode mode, uint64_t ms);
  void start_timer(uint64_t ms);
  void update_reading();
  bool output_blocked() const { return buffered_ >= kOutputHighWater; }
  void arm_flush_timer();
  void output_drained();
  void flush_timer_fired();
  // The status line and header block, appended to `out`; head_size_hint() bounds its size for a
  // reserve().
  void append_head(std::string& out, int status, const std::vector<Header>& headers, bool chunked,
                   size_t content_length, bool streaming);
  static size_t head_size_hint(const std::vector<Header>& headers);
  // Queues response bytes; they are written at the end of the loop turn (flush_output).
  void queue_write(std::string data);
  // The same, appending in place: `fill(pending_)` appends the bytes (one buffer per turn, no
  // temporary per chunk).
  template <typename Fill>
  void append_output(Fill&& fill) {
    if (phase_ == Phase::kClosed || !tcp_) return;
    const size_t before = pending_.size();
    fill(pending_);
    output_appended(pending_.size() - before);
  }
  void output_appended(size_t n);
  // `n` bytes left our buffers for the kernel: completes a finishing connection, resumes
  // parsing, or fires on_drain. `before` is buffered_ before they left.
  void output_taken(size_t n, size_t before);
  void count_response(int status);
  bool active(uint64_t seq) const { return phase_ == Phase::kDispatched && seq == seq_; }
  void clear_callbacks();

  HttpWorker& worker_;
  detail::UvHandle<uv_tcp_t> tcp_;
  detail::UvHandle<uv_timer_t> timer_;
  std::shared_ptr<HttpConnection> self_;
  std::string peer_;
  // TLS listeners: the session (null on plain TCP); true until its handshake completed.
  std::unique_ptr<TlsSession> tls_;
  bool tls_handshaking_ = false;
  // Ciphertext bytes written beyond the plaintext they carry (record overhead, handshake,
  // alerts): bytes_delivered() compares kernel queues (ciphertext) with queued_total_ (plaintext).
  uint64_t tls_extra_ = 0;

  Phase phase_ = Phase::kReading;
  TimerMode timer_mode_ = TimerMode::kNone;
  // The timer is lazy (as the upstream connections' one): the mode's timeout is due at
  // deadline_ms_ (loop time; kNoDeadline: the mode has none running), and the libuv timer, when
  // running, is due at timer_due_ms_, at or before that deadline. A later deadline (the idle time
  // after each answer, after the stop at each dispatch) only moves deadline_ms_; the timer, when
  // it fires early, re-arms for what is left.
  static constexpr uint64_t kNoDeadline = UINT64_MAX;
  uint64_t deadline_ms_ = kNoDeadline;
  uint64_t timer_due_ms_ = 0;
  bool timer_running_ = false;
  bool reading_ = false;
  bool processing_ = false;
  bool counted_active_ = false;

  // Input side
  llhttp_t parser_{};
  std::string inbuf_;      // received, not yet parsed
  size_t inbuf_off_ = 0;   // parsed prefix of inbuf_
  Request req_;            // being parsed
  bool in_header_value_ = false;
  bool headers_done_ = false;
  bool message_done_ = false;
  bool got_bytes_ = false;  // bytes of the current request have arrived
  size_t header_bytes_ = 0;
  size_t header_fed_ = 0;  // raw bytes parsed while headers are incomplete
  uint8_t header_scan_state_ = 0;  // obs-fold scan (scan_header_bytes)
  bool header_scan_done_ = false;
  int pending_error_status_ = 0;
  const char* pending_error_reason_ = nullptr;

  // Current exchange
  uint64_t seq_ = 0;
  ResponseState response_ = ResponseState::kNone;
  bool close_after_ = false;
  bool head_request_ = false;
  bool http10_ = false;
  bool raw_stream_ = false;  // HTTP/1.0 stream: close-delimited body
  bool client_gone_ = false;
  std::function<void()> on_drain_;
  std::function<void()> on_client_close_;
  std::string request_line_;  // "GET /x" for the per-request debug log

  std::string pending_;         // queued this loop turn, not yet written (flush_output)
  bool flush_scheduled_ = false;
  size_t buffered_ = 0;  // bytes queued and not yet taken by the kernel (pending_ + uv_write)
  // Bytes the client has received (bytes_delivered()) when the flush timer was armed: the
  // client made progress if that grew.
  uint64_t flush_mark_ = 0;
  static constexpr uint64_t kMarkAtFlush = ~uint64_t{0};  // taken when the pending bytes are written
  uint64_t queued_total_ = 0;  // every byte ever queued on this connection
  // queued_total_ minus what is still ours (pending_, libuv's write queue) and what is still in
  // the kernel's send queue, unacknowledged (SIOCOUTQ): moves as soon as the client reads,
  // however much the kernel had buffered.
  uint64_t bytes_delivered() const;
};

}  // namespace pdr::http
