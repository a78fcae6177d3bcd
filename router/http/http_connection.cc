#include "router/http/http_connection.h"

#include <linux/sockios.h>
#include "proto/base/guarded.h"
#include "proto/base/log.h"
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cstring>
#include <exception>
#include <utility>

#include "router/http/http_worker.h"
#include "router/http/json_error.h"
#include "router/http/tls_client.h"
#include "router/http/write_now.h"

namespace pdr::http {

namespace {

// After the last response on a closing connection: time allowed to flush it, then to receive
// the client's FIN after ours. Closing while unread client bytes sit in our receive buffer makes
// the kernel send RST, which can destroy the error response before the client reads it (the
// classic 413-while-uploading case), hence the lingering close.
constexpr uint64_t kFlushTimeoutMs = 30000;
constexpr uint64_t kLingerTimeoutMs = 2000;
// Pipelined input buffered while a response is pending, beyond the header limit, before we stop
// reading from the socket.
constexpr size_t kPipelineSlack = 64 * 1024;

struct WriteReq {
  uv_write_t req{};
  std::string data;
  size_t offset = 0;  // written at once before the request was made (flush_output)
  size_t credit = 0;  // bytes of buffered_ this write releases when it completes
  HttpConnection* conn = nullptr;
};

// Handshake messages, alerts and close_notify on their way (not counted in buffered_).
struct CipherWriteReq {
  uv_write_t req{};
  std::string bytes;
};

// Answer to plain HTTP sent to a TLS listener (as nginx's 497): the client learns why, in the
// protocol it speaks, instead of a reset.
constexpr std::string_view kPlainHttpAnswer =
    "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 51\r\n\r\n"
    "This port speaks TLS: use https:// to connect here\n";

template <typename Fn>
void invoke_guarded(Fn& fn, const char* what) {
  run_guarded("http", what, fn);
}


std::string peer_name(uv_tcp_t* tcp) {
  sockaddr_storage ss{};
  int len = sizeof(ss);
  if (uv_tcp_getpeername(tcp, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char ip[64] = {0};
  // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict, a false positive) on the
  // operator+ chain once this is inlined into HttpConnection::open.
  std::string out;
  if (ss.ss_family == AF_INET) {
    const auto* sin = reinterpret_cast<const sockaddr_in*>(&ss);
    uv_ip4_name(sin, ip, sizeof(ip));
    out.append(ip).append(":").append(std::to_string(ntohs(sin->sin_port)));
    return out;
  }
  if (ss.ss_family == AF_INET6) {
    const auto* sin6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    uv_ip6_name(sin6, ip, sizeof(ip));
    out.append("[").append(ip).append("]:").append(std::to_string(ntohs(sin6->sin6_port)));
    return out;
  }
  return "?";
}

HttpConnection* from_parser(llhttp_t* p) { return static_cast<HttpConnection*>(p->data); }

// llhttp 8.1 accepts obs-fold (a header line continued by a line starting with SP or HTAB) and
// its callbacks cannot tell it from a value split across reads, so the raw header bytes are
// scanned here. RFC 9112 5.2 allows rejecting it; a front proxy reading folds differently from
// us could otherwise be desynchronised. `state` carries the position across reads (0: inside a
// line, 1: after a LF, 2: after LF CR). Returns true once the header block's empty line (or a
// fold, then *fold is set) has been seen: the bytes after it are body or the next request.
bool scan_header_bytes(const char* data, size_t len, uint8_t* state, bool* fold) {
  for (size_t i = 0; i < len; ++i) {
    if (*state == 0) {
      // Inside a line only its end matters: jump there (memchr) instead of looking at each byte.
      const void* lf = std::memchr(data + i, '\n', len - i);
      if (lf == nullptr) return false;
      i = static_cast<size_t>(static_cast<const char*>(lf) - data);
    }
    const char c = data[i];
    switch (*state) {
      case 1:
        if (c == ' ' || c == '\t') {
          *fold = true;
          return true;
        }
        if (c == '\n') return true;
        *state = c == '\r' ? 2 : 0;
        break;
      case 2:
        if (c == '\n') return true;
        *state = 0;
        break;
      default:
        if (c == '\n') *state = 1;
        break;
    }
  }
  return false;
}

}  // namespace

const llhttp_settings_t* HttpConnection::parser_settings() {
  static const llhttp_settings_t settings = [] {
    llhttp_settings_t s;
    llhttp_settings_init(&s);
    s.on_message_begin = &HttpConnection::on_message_begin;
    s.on_url = &HttpConnection::on_url;
    s.on_header_field = &HttpConnection::on_header_field;
    s.on_header_value = &HttpConnection::on_header_value;
    s.on_headers_complete = &HttpConnection::on_headers_complete;
    s.on_body = &HttpConnection::on_body;
    s.on_message_complete = &HttpConnection::on_message_complete;
    return s;
  }();
  return &settings;
}

HttpConnection::HttpConnection(HttpWorker& worker) : worker_(worker) {
  llhttp_init(&parser_, HTTP_REQUEST, parser_settings());
  parser_.data = this;
}

HttpConnection::~HttpConnection() = default;

int HttpConnection::open(int fd) {
  int rc = tcp_.init(this, [&](uv_tcp_t* h) { return uv_tcp_init(worker_.loop(), h); });
  if (rc < 0) {
    ::close(fd);
    return rc;
  }
  rc = uv_tcp_open(tcp_.get(), fd);
  if (rc < 0) {
    ::close(fd);
    tcp_.close();
    return rc;
  }
  rc = timer_.init(this, [&](uv_timer_t* t) { return uv_timer_init(worker_.loop(), t); });
  if (rc < 0) {
    tcp_.close();
    return rc;
  }
  uv_tcp_nodelay(tcp_.get(), 1);
  peer_ = peer_name(tcp_.get());
  if (const auto& tls = worker_.tls()) {
    if (Status st = TlsSession::create_server(tls->native(), peer_, &tls_); !st) {
      pdr::log::warn("http {}: {}", peer_, st.message());
      timer_.close();
      tcp_.close();
      return UV_ENOMEM;
    }
    tls_handshaking_ = true;  // the header timer armed below bounds the handshake too
  }
  self_ = shared_from_this();
  arm_timer(TimerMode::kHeaders, static_cast<uint64_t>(worker_.options().header_read_timeout.count()));
  update_reading();
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Input

void HttpConnection::on_alloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
  auto* self = detail::UvHandle<uv_tcp_t>::owner_of<HttpConnection>(h);
  buf->base = self->worker_.read_buffer();
  buf->len = self->worker_.read_buffer_size();
}

void HttpConnection::on_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
  detail::UvHandle<uv_tcp_t>::owner_of<HttpConnection>(s)->handle_read(nread, buf);
}

void HttpConnection::handle_read(ssize_t nread, const uv_buf_t* buf) {
  if (nread == 0) return;
  if (tls_ && nread > 0 && (phase_ == Phase::kReading || phase_ == Phase::kDispatched)) {
    handle_tls_read(nread, buf);
    return;
  }
  if (nread < 0) {
    if (nread != UV_EOF) pdr::log::debug("http {}: read error: {}", peer_, uv_strerror(static_cast<int>(nread)));
    if (tls_handshaking_) tls_handshake_failed(TlsFailure::kClosed, "connection closed during the TLS handshake");
    close_now();
    return;
  }
  handle_input(buf->base, static_cast<size_t>(nread));
}

void HttpConnection::handle_input(const char* data, size_t len) {
  switch (phase_) {
    case Phase::kClosed:
    case Phase::kFinishing:
    case Phase::kLingering:
      return;  // discarded: we are closing
    case Phase::kDispatched:
      inbuf_.append(data, len);
      update_reading();
      return;
    case Phase::kReading:
      break;
  }
  inbuf_.append(data, len);
  got_bytes_ = true;
  // The body timer is NOT re-armed here: body_read_timeout bounds the whole body, so a client
  // trickling a byte at a time cannot hold the connection and its partial body forever.
  process_input();
  // The header timer starts with a request's first bytes. It is armed after parsing, so that a
  // request that arrived whole (dispatched above) never starts it: the idle timer it would
  // replace is stopped by dispatch() anyway.
  if (phase_ == Phase::kReading && got_bytes_ &&
      (timer_mode_ == TimerMode::kIdle || (timer_mode_ == TimerMode::kFlush && !output_blocked()))) {
    arm_timer(TimerMode::kHeaders, static_cast<uint64_t>(worker_.options().header_read_timeout.count()));
  }
}

void HttpConnection::process_input() {
  if (processing_) return;  // re-entered from a handler that answered synchronously
  processing_ = true;
  const size_t max_header = worker_.options().max_header_bytes;
  // Output back-pressure: no request is parsed (hence none answered) while kOutputHighWater
  // response bytes wait for the client; on_write resumes here once they drain.
  while (phase_ == Phase::kReading && inbuf_off_ < inbuf_.size() && !output_blocked()) {
    got_bytes_ = true;
    const char* data = inbuf_.data() + inbuf_off_;
    const size_t len = inbuf_.size() - inbuf_off_;
    if (!headers_done_ && !header_scan_done_) {
      bool fold = false;
      header_scan_done_ = scan_header_bytes(data, len, &header_scan_state_, &fold);
      if (fold) {
        worker_.stats().bad_requests.fetch_add(1, std::memory_order_relaxed);
        send_error_and_close(400, "malformed HTTP request: obs-fold (a header line continued on the next line) is not accepted",
                             "invalid_request_error", "bad_request");
        break;
      }
    }
    const llhttp_errno_t err = llhttp_execute(&parser_, data, len);
    if (phase_ == Phase::kClosed) break;
    size_t consumed = len;
    if (err == HPE_PAUSED || err == HPE_PAUSED_UPGRADE) {
      consumed = static_cast<size_t>(llhttp_get_error_pos(&parser_) - data);
    } else if (err != HPE_OK) {
      const int status = pending_error_status_ != 0 ? pending_error_status_ : 400;
      if (status == 431) {
        worker_.stats().header_too_large.fetch_add(1, std::memory_order_relaxed);
        send_error_and_close(431, "request header fields too large", "invalid_request_error",
                             "header_too_large");
      } else if (status == 413) {
        worker_.stats().body_too_large.fetch_add(1, std::memory_order_relaxed);
        send_error_and_close(413, pending_error_reason_ ? pending_error_reason_ : "request body too large",
                             "invalid_request_error", "body_too_large");
      } else if (status == 503) {
        // The body budget refused it (counted by the budget); the body is not read.
        req_.body_charge.reset();
        send_error_and_close(503, pending_error_reason_ ? pending_error_reason_ : "out of memory budget",
                             "server_error", "memory_budget", /*retry_after=*/true);
      } else {
        worker_.stats().bad_requests.fetch_add(1, std::memory_order_relaxed);
        const char* reason = llhttp_get_error_reason(&parser_);
        std::string msg = "malformed HTTP request (";
        msg += llhttp_errno_name(err);
        msg += "): ";
        msg += reason ? reason : "parse error";
        send_error_and_close(400, msg, "invalid_request_error", "bad_request");
      }
      break;
    }
    inbuf_off_ += consumed;
    if (!headers_done_) {
      // Backstop for bytes the per-field accounting does not see (line folding, whitespace).
      header_fed_ += consumed;
      if (header_fed_ > max_header + 4096) {
        worker_.stats().header_too_large.fetch_add(1, std::memory_order_relaxed);
        send_error_and_close(431, "request header fields too large", "invalid_request_error",
                             "header_too_large");
        break;
      }
    }
    if (message_done_) {
      message_done_ = false;
      dispatch();
      continue;
    }
    // HPE_OK: all input consumed, need more. A body still to come is bounded from here by
    // body_read_timeout (armed only now, so a request that arrived whole never starts it).
    if (headers_done_ && timer_mode_ != TimerMode::kBody) {
      arm_timer(TimerMode::kBody, static_cast<uint64_t>(worker_.options().body_read_timeout.count()));
    }
    break;
  }
  if (inbuf_off_ >= inbuf_.size()) {
    inbuf_.clear();
    inbuf_off_ = 0;
  } else if (inbuf_off_ > 0 && phase_ == Phase::kReading) {
    inbuf_.erase(0, inbuf_off_);
    inbuf_off_ = 0;
  }
  processing_ = false;
  if (phase_ == Phase::kReading && output_blocked() && timer_mode_ != TimerMode::kFlush) arm_flush_timer();
  update_reading();
}

bool HttpConnection::add_header_bytes(size_t n) {
  header_bytes_ += n;
  return header_bytes_ <= worker_.options().max_header_bytes;
}

int HttpConnection::fail_parse(int status, const char* reason) {
  pending_error_status_ = status;
  pending_error_reason_ = reason;
  llhttp_set_error_reason(&parser_, reason);
  return HPE_USER;
}

int HttpConnection::on_message_begin(llhttp_t* p) {
  HttpConnection* c = from_parser(p);
  c->req_ = Request{};
  c->req_.headers.reserve(8);  // one allocation for a typical request's fields
  c->in_header_value_ = false;
  c->headers_done_ = false;
  c->header_bytes_ = 0;
  return 0;
}

int HttpConnection::on_url(llhttp_t* p, const char* at, size_t len) {
  HttpConnection* c = from_parser(p);
  if (!c->add_header_bytes(len)) return c->fail_parse(431, "request header fields too large");
  c->req_.target.append(at, len);
  return 0;
}

int HttpConnection::on_header_field(llhttp_t* p, const char* at, size_t len) {
  HttpConnection* c = from_parser(p);
  const bool new_field = c->in_header_value_ || c->req_.headers.empty();
  if (!c->add_header_bytes(len + (new_field ? 4 : 0))) {
    return c->fail_parse(431, "request header fields too large");
  }
  if (new_field) {
    c->req_.headers.emplace_back();
    c->in_header_value_ = false;
  }
  c->req_.headers.back().name.append(at, len);
  return 0;
}

int HttpConnection::on_header_value(llhttp_t* p, const char* at, size_t len) {
  HttpConnection* c = from_parser(p);
  if (!c->add_header_bytes(len)) return c->fail_parse(431, "request header fields too large");
  c->in_header_value_ = true;
  if (c->req_.headers.empty()) c->req_.headers.emplace_back();
  c->req_.headers.back().value.append(at, len);
  return 0;
}

int HttpConnection::on_headers_complete(llhttp_t* p) {
  HttpConnection* c = from_parser(p);
  Request& r = c->req_;
  const ServerOptions& opt = c->worker_.options();
  c->headers_done_ = true;
  r.head_at = std::chrono::steady_clock::now();
  r.method = llhttp_method_name(static_cast<llhttp_method_t>(p->method));
  r.http_major = p->http_major;
  r.http_minor = p->http_minor;
  // Upgrades (WebSocket, h2c) are not supported: answer as plain HTTP, then close.
  r.keep_alive = llhttp_should_keep_alive(p) != 0 && p->upgrade == 0;
  const size_t q = r.target.find('?');
  r.path = r.target.substr(0, q);
  if (q != std::string::npos) r.query = r.target.substr(q + 1);

  const bool has_length = (p->flags & F_CONTENT_LENGTH) != 0;
  const bool chunked = (p->flags & F_CHUNKED) != 0;
  if (has_length && p->content_length > opt.max_body_bytes) {
    // Returning -1 stops the parser before any body byte is consumed.
    c->pending_error_status_ = 413;
    c->pending_error_reason_ = "request body too large (Content-Length exceeds the limit)";
    return -1;
  }
  const bool body_expected = chunked || (has_length && p->content_length > 0);
  if (has_length && p->content_length > 0 && opt.body_budget != nullptr &&
      !r.body_charge.grow_to(opt.body_budget, c->worker_.index(), static_cast<size_t>(p->content_length))) {
    // The body would take the shared budget over: refused before a byte of it is read.
    c->pending_error_status_ = 503;
    c->pending_error_reason_ = "pdrouter is holding too many request bytes (limits.max_buffered_bytes); retry later";
    return -1;
  }
  if (has_length) r.body.reserve(static_cast<size_t>(p->content_length));  // bounded just above
  if (body_expected) {
    if (auto expect = r.header("expect");
        expect && iequals(*expect, "100-continue") && (r.http_major > 1 || r.http_minor >= 1)) {
      c->count_response(100);
      c->queue_write("HTTP/1.1 100 Continue\r\n\r\n");
      if (c->phase_ != Phase::kReading) return -1;
    }
    // The body timer is armed by process_input if the body is not all here yet.
  } else {
    c->arm_timer(TimerMode::kNone, 0);
  }
  return 0;
}

int HttpConnection::on_body(llhttp_t* p, const char* at, size_t len) {
  HttpConnection* c = from_parser(p);
  std::string& body = c->req_.body;
  const ServerOptions& opt = c->worker_.options();
  if (body.size() + len > opt.max_body_bytes) {
    return c->fail_parse(413, "request body too large (chunked body exceeds the limit)");
  }
  if (body.size() + len > body.capacity()) {
    // A chunked body grows its buffer here (a Content-Length one was reserved whole): the
    // budget is charged the buffer's new capacity, what the body really costs, before it grows.
    const size_t capacity = std::min<size_t>(opt.max_body_bytes, std::max(body.size() + len, 2 * body.capacity()));
    if (opt.body_budget != nullptr && !c->req_.body_charge.grow_to(opt.body_budget, c->worker_.index(), capacity)) {
      return c->fail_parse(503, "pdrouter is holding too many request bytes (limits.max_buffered_bytes); retry later");
    }
    body.reserve(capacity);
  }
  body.append(at, len);
  return 0;
}

int HttpConnection::on_message_complete(llhttp_t* p) {
  // Pause so execute() returns right after this message: pipelined bytes stay unparsed until
  // the response is complete, which keeps responses in request order.
  from_parser(p)->message_done_ = true;
  return HPE_PAUSED;
}

// ---------------------------------------------------------------------------------------------
// Exchange

void HttpConnection::dispatch() {
  phase_ = Phase::kDispatched;
  ++seq_;
  const uint64_t seq = seq_;
  response_ = ResponseState::kNone;
  raw_stream_ = false;
  client_gone_ = false;
  arm_timer(TimerMode::kNone, 0);
  head_request_ = req_.method == "HEAD";
  http10_ = req_.http_major == 1 && req_.http_minor == 0;
  close_after_ = !req_.keep_alive || worker_.draining();
  req_.peer = peer_;
  req_.worker = worker_.index();
  request_line_.assign(req_.method).append(" ").append(req_.target);  // keeps its capacity
  worker_.stats().requests.fetch_add(1, std::memory_order_relaxed);

  Request req = std::move(req_);
  req_ = Request{};
  std::shared_ptr<HttpConnection> self = shared_from_this();
  const char* failure = nullptr;
  std::string what;
  try {
    worker_.handler()(std::move(req), ResponseWriter(self, seq));
  } catch (const std::exception& e) {
    failure = "exception";
    what = e.what();
  } catch (...) {
    failure = "non-std exception";
  }
  if (failure != nullptr) {
    // The writer passed to the handler was destroyed during unwinding (answering 500) unless the
    // handler had moved it elsewhere; then its new holder still owns the response.
    pdr::log::error("http {}: handler threw ({}) on \"{}\": {}", peer_, failure, request_line_, what);
  }
}

bool HttpConnection::writer_send(uint64_t seq, Response&& response) {
  assert(HttpWorker::current() == &worker_);
  if (!active(seq) || response_ != ResponseState::kNone) return false;
  response_ = ResponseState::kDone;
  append_output([&](std::string& out) {
    out.reserve(out.size() + head_size_hint(response.headers) + (head_request_ ? 0 : response.body.size()));
    append_head(out, response.status, response.headers, false, response.body.size(), false);
    if (!head_request_) out += response.body;
  });
  count_response(response.status);
  pdr::log::debug("http {} \"{}\" {} {}B", peer_, request_line_, response.status, response.body.size());
  finish_response();
  return true;
}

bool HttpConnection::writer_start_stream(uint64_t seq, int status, std::vector<Header>&& headers) {
  assert(HttpWorker::current() == &worker_);
  if (!active(seq) || response_ != ResponseState::kNone) return false;
  response_ = ResponseState::kStreaming;
  raw_stream_ = http10_;  // HTTP/1.0 has no chunked coding: close-delimited body
  append_output([&](std::string& out) {
    // Room for the first events too: they usually leave with the head (one write per turn).
    out.reserve(out.size() + head_size_hint(headers) + 1024);
    append_head(out, status, headers, !raw_stream_, 0, true);
  });
  count_response(status);
  pdr::log::debug("http {} \"{}\" {} (stream)", peer_, request_line_, status);
  return phase_ == Phase::kDispatched;
}

bool HttpConnection::writer_write(uint64_t seq, std::string_view chunk) {
  assert(HttpWorker::current() == &worker_);
  if (!active(seq) || response_ != ResponseState::kStreaming) return false;
  if (chunk.empty() || head_request_) return true;
  append_output([&](std::string& out) {
    if (raw_stream_) {
      out.append(chunk);
      return;
    }
    char size_line[24];
    const int n = snprintf(size_line, sizeof(size_line), "%zx\r\n", chunk.size());
    out.reserve(out.size() + static_cast<size_t>(n) + chunk.size() + 2 + 5);  // + the last chunk
    out.append(size_line, static_cast<size_t>(n));
    out.append(chunk);
    out.append("\r\n");
  });
  return phase_ == Phase::kDispatched;
}

void HttpConnection::writer_end_stream(uint64_t seq) {
  assert(HttpWorker::current() == &worker_);
  if (!active(seq) || response_ != ResponseState::kStreaming) return;
  response_ = ResponseState::kDone;
  if (!raw_stream_ && !head_request_) queue_write("0\r\n\r\n");
  finish_response();
}

size_t HttpConnection::writer_buffered_bytes(uint64_t seq) const {
  return (seq == seq_ && phase_ != Phase::kClosed) ? buffered_ : 0;
}

void HttpConnection::writer_on_drain(uint64_t seq, std::function<void()> fn) {
  if (active(seq) && response_ != ResponseState::kDone) on_drain_ = std::move(fn);
}

void HttpConnection::writer_on_client_close(uint64_t seq, std::function<void()> fn) {
  if (seq == seq_ && client_gone_) {
    if (fn) invoke_guarded(fn, "on_client_close");
    return;
  }
  if (active(seq) && response_ != ResponseState::kDone) on_client_close_ = std::move(fn);
}

bool HttpConnection::writer_client_gone(uint64_t seq) const {
  return phase_ == Phase::kClosed || (seq == seq_ && client_gone_);
}

void HttpConnection::writer_dropped(uint64_t seq) {
  if (!active(seq) || response_ == ResponseState::kDone) return;
  worker_.stats().handler_errors.fetch_add(1, std::memory_order_relaxed);
  if (response_ == ResponseState::kNone) {
    pdr::log::warn("http {}: handler dropped \"{}\" without a response; answering 500", peer_, request_line_);
    writer_send(seq, error_response(500, "the server produced no response for this request",
                                    "server_error", "internal_error"));
  } else {
    pdr::log::warn("http {}: stream for \"{}\" abandoned before its end; closing", peer_, request_line_);
    clear_callbacks();
    close_now();
  }
}

void HttpConnection::writer_abort(uint64_t seq) {
  if (!active(seq) || response_ == ResponseState::kDone) return;
  clear_callbacks();
  response_ = ResponseState::kDone;  // the handler chose this: not a client abort
  pdr::log::debug("http {}: \"{}\" aborted by its handler", peer_, request_line_);
  close_now();
}

void HttpConnection::clear_callbacks() {
  // Moved out first: destroying a callback may drop a ResponseWriter, which calls back in.
  std::function<void()> drain = std::move(on_drain_);
  std::function<void()> close = std::move(on_client_close_);
  on_drain_ = nullptr;
  on_client_close_ = nullptr;
}

void HttpConnection::finish_response() {
  if (phase_ != Phase::kDispatched) return;
  clear_callbacks();
  if (phase_ != Phase::kDispatched) return;
  if (close_after_ || worker_.draining()) {
    begin_close_after_flush();
    return;
  }
  begin_next_request();
  if (!processing_) process_input();
}

void HttpConnection::begin_next_request() {
  phase_ = Phase::kReading;
  if (llhttp_get_errno(&parser_) == HPE_PAUSED) llhttp_resume(&parser_);
  headers_done_ = false;
  message_done_ = false;
  header_fed_ = 0;
  header_scan_state_ = 0;
  header_scan_done_ = false;
  pending_error_status_ = 0;
  pending_error_reason_ = nullptr;
  got_bytes_ = inbuf_off_ < inbuf_.size();
  const ServerOptions& opt = worker_.options();
  if (output_blocked()) {
    arm_flush_timer();  // the next request waits for the client to read (on_write resumes it)
  } else if (got_bytes_) {
    arm_timer(TimerMode::kHeaders, static_cast<uint64_t>(opt.header_read_timeout.count()));
  } else if (buffered_ > 0) {
    // Not idle yet: the last answer is still being written. keep_alive_idle starts once it has
    // drained (on_write); until then the flush timer closes a connection whose output stalls.
    arm_flush_timer();
  } else {
    arm_timer(TimerMode::kIdle, static_cast<uint64_t>(opt.keep_alive_idle.count()));
  }
  update_reading();
}

void HttpConnection::send_error_and_close(int status, std::string_view message, std::string_view type,
                                          std::string_view code, bool retry_after) {
  if (phase_ == Phase::kClosed) return;
  Response r = error_response(status, message, type, code);
  if (retry_after) r.headers.push_back({"Retry-After", "1"});
  close_after_ = true;
  head_request_ = false;
  http10_ = false;
  std::string out;
  append_head(out, r.status, r.headers, false, r.body.size(), false);
  out += r.body;
  count_response(status);
  pdr::log::debug("http {}: {} {}", peer_, status, message);
  inbuf_.clear();
  inbuf_off_ = 0;
  queue_write(std::move(out));
  if (phase_ == Phase::kClosed) return;
  begin_close_after_flush();
}

void HttpConnection::begin_close_after_flush() {
  phase_ = Phase::kFinishing;
  inbuf_.clear();
  inbuf_off_ = 0;
  if (buffered_ == 0) {
    start_lingering();
    return;
  }
  arm_timer(TimerMode::kLinger, kFlushTimeoutMs);
  update_reading();
}

void HttpConnection::start_lingering() {
  phase_ = Phase::kLingering;
  if (tls_ && !tls_handshaking_) {
    // close_notify before the FIN: a close-delimited answer (HTTP/1.0 stream) ends cleanly, not as
    // a truncation attack to the client's TLS stack.
    tls_->close_notify();
    if (tls_->has_output()) send_ciphertext(tls_->take_output());
  }
  auto* req = new uv_shutdown_t;
  const int rc = uv_shutdown(req, tcp_.stream(), &HttpConnection::on_shutdown);
  if (rc < 0) {
    delete req;
    close_now();
    return;
  }
  arm_timer(TimerMode::kLinger, kLingerTimeoutMs);
  update_reading();
}

void HttpConnection::on_shutdown(uv_shutdown_t* req, int) { delete req; }

void HttpConnection::begin_drain() {
  if (phase_ == Phase::kReading && !got_bytes_) {
    if (buffered_ > 0) {
      begin_close_after_flush();  // let the last answer reach the client first
    } else {
      close_now();
    }
    return;
  }
  close_after_ = true;
}

void HttpConnection::close_now() {
  if (phase_ == Phase::kClosed) return;
  const bool pending = phase_ == Phase::kDispatched && response_ != ResponseState::kDone;
  if (!pending_.empty()) {
    // Bytes queued this turn were sent as far as the handler is concerned (as when they went to
    // uv_write at once): the kernel gets what it takes now, before the close.
    if (tcp_ && tls_ && !tls_handshaking_) {
      if (tls_->write(pending_)) detail::write_now(tcp_.stream(), tls_->take_output());
    } else if (tcp_ && !tls_) {
      detail::write_now(tcp_.stream(), pending_);
    }
    buffered_ -= pending_.size();
    worker_.stats().output_buffered_bytes.fetch_sub(pending_.size(), std::memory_order_relaxed);
    pending_.clear();
  }
  phase_ = Phase::kClosed;
  timer_mode_ = TimerMode::kNone;
  timer_running_ = false;
  timer_.close();
  reading_ = false;
  inbuf_.clear();
  inbuf_off_ = 0;
  if (self_) {
    HttpWorker* worker = &worker_;
    tcp_.close([self = std::move(self_), worker] { worker->connection_closed(self.get()); });
  } else {
    tcp_.close();
  }
  if (pending) {
    client_gone_ = true;
    worker_.stats().client_aborts.fetch_add(1, std::memory_order_relaxed);
    pdr::log::debug("http {}: connection closed with \"{}\" pending", peer_, request_line_);
    std::function<void()> cb = std::move(on_client_close_);
    on_client_close_ = nullptr;
    std::function<void()> drain = std::move(on_drain_);
    on_drain_ = nullptr;
    if (cb) invoke_guarded(cb, "on_client_close");
  }
}

// ---------------------------------------------------------------------------------------------
// Output

size_t HttpConnection::head_size_hint(const std::vector<Header>& headers) {
  size_t n = 160;
  for (const Header& h : headers) n += h.name.size() + h.value.size() + 4;
  return n;
}

void HttpConnection::append_head(std::string& out, int status, const std::vector<Header>& headers, bool chunked,
                                 size_t content_length, bool streaming) {
  using namespace std::string_view_literals;  // literals with their length: no strlen per append
  char number[24];
  out += "HTTP/1.1 "sv;
  out.append(number, static_cast<size_t>(std::to_chars(number, number + sizeof number, status).ptr - number));
  out += ' ';
  out += reason_phrase(status);
  out += "\r\nServer: pdrouter/" PDR_VERSION "\r\n"sv;
  for (const Header& h : headers) {
    if (is_server_managed_header(h.name)) continue;
    if (h.name.empty() || has_crlf_or_nul(h.name) || has_crlf_or_nul(h.value)) {
      pdr::log::warn("http {}: dropping response header with CR/LF/NUL: {}", peer_, h.name);
      continue;
    }
    out += h.name;
    out += ": "sv;
    out += h.value;
    out += "\r\n"sv;
  }
  if (chunked) {
    out += "Transfer-Encoding: chunked\r\n"sv;
  } else if (!streaming) {
    out += "Content-Length: "sv;
    out.append(number,
               static_cast<size_t>(std::to_chars(number, number + sizeof number, content_length).ptr - number));
    out += "\r\n"sv;
  }
  if (close_after_ || worker_.draining() || (streaming && !chunked)) {
    close_after_ = true;
    out += "Connection: close\r\n"sv;
  } else if (http10_) {
    out += "Connection: keep-alive\r\n"sv;
  }
  out += "\r\n"sv;
}

void HttpConnection::count_response(int status) {
  const int cls = status / 100;
  if (cls >= 1 && cls <= 5) {
    worker_.stats().responses_by_class[static_cast<size_t>(cls)].fetch_add(1, std::memory_order_relaxed);
  }
}

void HttpConnection::queue_write(std::string data) {
  if (phase_ == Phase::kClosed || !tcp_ || data.empty()) return;
  const size_t n = data.size();
  if (pending_.empty()) {
    pending_ = std::move(data);
  } else {
    pending_ += data;
  }
  output_appended(n);
}

void HttpConnection::output_appended(size_t n) {
  if (n == 0) return;
  buffered_ += n;
  queued_total_ += n;
  worker_.stats().output_buffered_bytes.fetch_add(n, std::memory_order_relaxed);
  if (!flush_scheduled_) {
    flush_scheduled_ = true;
    worker_.schedule_flush(shared_from_this());
  }
}

void HttpConnection::flush_output() {
  flush_scheduled_ = false;
  if (pending_.empty() || phase_ == Phase::kClosed || !tcp_) return;
  std::string data = std::move(pending_);
  pending_.clear();
  const size_t before = buffered_;
  worker_.stats().output_writes.fetch_add(1, std::memory_order_relaxed);
  bool failed = false;
  const size_t taken = write_out(std::move(data), &failed);
  if (failed) {
    close_now();
    return;
  }
  if (taken > 0) output_taken(taken, before);
  if (phase_ == Phase::kReading && timer_mode_ == TimerMode::kFlush && flush_mark_ == kMarkAtFlush) {
    flush_mark_ = bytes_delivered();
    arm_timer(TimerMode::kFlush, static_cast<uint64_t>(worker_.options().keep_alive_idle.count()));
  }
}

void HttpConnection::on_write(uv_write_t* req, int status) {
  // Write callbacks run before the tcp close callback (libuv cancels them in uv_close), so the
  // connection is alive here: its self-reference is released only in that close callback.
  auto* w = static_cast<WriteReq*>(req->data);
  HttpConnection* c = w->conn;
  const size_t n = w->credit;
  delete w;
  if (status < 0) {
    c->buffered_ -= n;
    c->worker_.stats().output_buffered_bytes.fetch_sub(n, std::memory_order_relaxed);
    if (c->phase_ != Phase::kClosed) {
      pdr::log::debug("http {}: write error: {}", c->peer_, uv_strerror(status));
      c->close_now();
    }
    return;
  }
  c->output_taken(n, c->buffered_);
}

void HttpConnection::output_taken(size_t n, size_t before) {
  buffered_ -= n;
  worker_.stats().output_buffered_bytes.fetch_sub(n, std::memory_order_relaxed);
  if (phase_ == Phase::kClosed) return;
  if (phase_ == Phase::kFinishing && buffered_ == 0) {
    start_lingering();
    return;
  }
  if (phase_ == Phase::kReading && timer_mode_ == TimerMode::kFlush) {
    output_drained();
    return;
  }
  if (before >= ResponseWriter::kDrainLowWater && buffered_ < ResponseWriter::kDrainLowWater && on_drain_) {
    const uint64_t seq = seq_;
    std::function<void()> fn = std::move(on_drain_);
    on_drain_ = nullptr;
    invoke_guarded(fn, "on_drain");
    if (!on_drain_ && active(seq) && response_ != ResponseState::kDone) {
      on_drain_ = std::move(fn);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// TLS

void HttpConnection::handle_tls_read(ssize_t nread, const uv_buf_t* buf) {
  tls_->feed(std::string_view(buf->base, static_cast<size_t>(nread)));
  if (tls_handshaking_) {
    Status error;
    const TlsSession::Step step = tls_->handshake(&error);
    if (step == TlsSession::Step::kFailed) {
      tls_handshake_failed(classify_handshake_failure(*tls_), error.message());
      return;
    }
    if (tls_->has_output()) send_ciphertext(tls_->take_output());
    if (step == TlsSession::Step::kPending || phase_ == Phase::kClosed) return;
    tls_handshaking_ = false;
    worker_.stats().tls_handshakes.fetch_add(1, std::memory_order_relaxed);
  }
  // One socket read's records, all decrypted now (the input BIO holds at most one read beyond a
  // partial record), so a connection that stopped reading holds no ciphertext of its own.
  for (;;) {
    size_t n = 0;
    Status error;
    const TlsSession::Read r =
        tls_->read(std::span<char>(worker_.plain_buffer(), worker_.plain_buffer_size()), &n, &error);
    if (r == TlsSession::Read::kWantMore) break;
    if (r == TlsSession::Read::kFailed) {
      worker_.stats().tls_failures[static_cast<size_t>(TlsFailure::kRecord)].fetch_add(1, std::memory_order_relaxed);
      pdr::log::debug("http {}: {}", peer_, error.message());
      close_now();
      return;
    }
    if (r == TlsSession::Read::kClosed) {  // close_notify: the client's end of stream
      close_now();
      return;
    }
    handle_input(worker_.plain_buffer(), n);
    if (phase_ == Phase::kClosed || !tls_) return;
  }
  if (tls_->has_output() && phase_ != Phase::kClosed) send_ciphertext(tls_->take_output());  // e.g. KeyUpdate
}

void HttpConnection::tls_handshake_failed(TlsFailure failure, const std::string& detail) {
  tls_handshaking_ = false;
  worker_.stats().tls_failures[static_cast<size_t>(failure)].fetch_add(1, std::memory_order_relaxed);
  pdr::log::debug("http {}: TLS handshake failed ({}): {}", peer_, tls_failure_name(failure), detail);
  if (phase_ == Phase::kClosed) return;
  std::string out = tls_->has_output() ? tls_->take_output() : std::string();  // the alert, if any
  if (failure == TlsFailure::kPlainHttp) out = std::string(kPlainHttpAnswer);
  // The session is over; what follows is a plain lingering close (start_lingering), which reads
  // and drops the client's bytes so that the answer is not lost to a reset.
  tls_.reset();
  if (failure == TlsFailure::kTimeout || failure == TlsFailure::kClosed) {
    close_now();
    return;
  }
  if (!out.empty()) send_ciphertext(std::move(out));
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kFinishing;
  start_lingering();
}

void HttpConnection::send_ciphertext(std::string bytes) {
  if (!tcp_ || bytes.empty()) return;
  tls_extra_ += bytes.size();
  const size_t taken = detail::write_now(tcp_.stream(), bytes);
  if (taken == bytes.size()) return;
  auto* w = new CipherWriteReq;
  w->bytes = bytes.substr(taken);
  w->req.data = w;
  uv_buf_t buf = uv_buf_init(w->bytes.data(), static_cast<unsigned>(w->bytes.size()));
  const int rc = uv_write(&w->req, tcp_.stream(), &buf, 1, [](uv_write_t* req, int) {
    delete static_cast<CipherWriteReq*>(req->data);  // a failure shows on the next read or write
  });
  if (rc < 0) delete w;
}

size_t HttpConnection::write_out(std::string&& data, bool* failed) {
  *failed = false;
  const size_t plain = data.size();
  // A failed write releases every byte of `plain` from buffered_: none of it is credited later.
  auto release = [&](size_t n) {
    buffered_ -= n;
    worker_.stats().output_buffered_bytes.fetch_sub(n, std::memory_order_relaxed);
    *failed = true;
  };
  if (tls_) {
    if (Status st = tls_->write(data); !st) {
      worker_.stats().tls_failures[static_cast<size_t>(TlsFailure::kRecord)].fetch_add(1, std::memory_order_relaxed);
      pdr::log::debug("http {}: {}", peer_, st.message());
      release(plain);
      return 0;
    }
    data = tls_->take_output();
    tls_extra_ += data.size() > plain ? data.size() - plain : 0;
  }
  // Written at once when the socket takes it (no write request, hence no epoll_ctl when it
  // completes); only what it does not take goes through uv_write.
  const size_t taken = detail::write_now(tcp_.stream(), data);
  if (taken == data.size()) return plain;
  // Ciphertext: the kernel's share of the plaintext, in proportion (records are the same size).
  const size_t plain_taken = tls_ ? static_cast<size_t>(static_cast<uint64_t>(taken) * plain / data.size()) : taken;
  auto* w = new WriteReq;
  w->data = std::move(data);
  w->offset = taken;
  w->credit = plain - plain_taken;
  w->conn = this;
  w->req.data = w;
  uv_buf_t buf = uv_buf_init(w->data.data() + taken, static_cast<unsigned int>(w->data.size() - taken));
  const int rc = uv_write(&w->req, tcp_.stream(), &buf, 1, &HttpConnection::on_write);
  if (rc < 0) {
    delete w;
    pdr::log::debug("http {}: write failed: {}", peer_, uv_strerror(rc));
    release(plain);
    return 0;
  }
  return plain_taken;
}

// ---------------------------------------------------------------------------------------------
// Timers and reading

void HttpConnection::arm_timer(TimerMode mode, uint64_t ms) {
  timer_mode_ = mode;
  deadline_ms_ = kNoDeadline;  // a running timer stays: see deadline_ms_
  if (!timer_ || mode == TimerMode::kNone) return;
  // Loop time, as uv_timer_start counts from it.
  deadline_ms_ = uv_now(worker_.loop()) + ms;
  if (timer_running_ && timer_due_ms_ <= deadline_ms_) return;  // fires first, re-arms for the rest
  start_timer(ms);
}

void HttpConnection::start_timer(uint64_t ms) {
  uv_timer_start(timer_.get(), &HttpConnection::on_timer, ms, 0);  // replaces a running one
  timer_running_ = true;
  timer_due_ms_ = uv_now(worker_.loop()) + ms;
}

void HttpConnection::on_timer(uv_timer_t* t) {
  auto* c = detail::UvHandle<uv_timer_t>::owner_of<HttpConnection>(t);
  c->timer_running_ = false;
  if (c->timer_mode_ == TimerMode::kNone || c->deadline_ms_ == kNoDeadline) return;
  if (const uint64_t now = uv_now(c->worker_.loop()); now < c->deadline_ms_) {
    c->start_timer(c->deadline_ms_ - now);  // armed before the deadline moved on: wait for the rest
    return;
  }
  const TimerMode mode = c->timer_mode_;
  c->timer_mode_ = TimerMode::kNone;
  switch (mode) {
    case TimerMode::kNone:
      return;
    case TimerMode::kIdle:
      c->worker_.stats().idle_timeouts.fetch_add(1, std::memory_order_relaxed);
      pdr::log::debug("http {}: keep-alive idle timeout", c->peer_);
      c->close_now();
      return;
    case TimerMode::kFlush:
      c->flush_timer_fired();
      return;
    case TimerMode::kHeaders:
    case TimerMode::kBody:
      if (c->phase_ != Phase::kReading) return;
      if (c->tls_handshaking_) {  // no HTTP answer can be sent before the handshake is done
        c->tls_handshake_failed(TlsFailure::kTimeout, "handshake not finished within the header read timeout");
        return;
      }
      (mode == TimerMode::kHeaders ? c->worker_.stats().header_timeouts : c->worker_.stats().body_timeouts)
          .fetch_add(1, std::memory_order_relaxed);
      c->send_error_and_close(408,
                              mode == TimerMode::kHeaders ? "timed out reading the request headers"
                                                          : "timed out reading the request body",
                              "invalid_request_error", "request_timeout");
      return;
    case TimerMode::kLinger:
      c->close_now();
      return;
  }
}

void HttpConnection::update_reading() {
  if (phase_ == Phase::kClosed || !tcp_) return;
  bool want = true;
  if (phase_ == Phase::kDispatched) {
    want = inbuf_.size() - inbuf_off_ < worker_.options().max_header_bytes + kPipelineSlack;
  } else if (phase_ == Phase::kReading && output_blocked()) {
    want = false;
  }
  if (want && !reading_) {
    if (uv_read_start(tcp_.stream(), &HttpConnection::on_alloc, &HttpConnection::on_read) == 0) {
      reading_ = true;
    }
  } else if (!want && reading_) {
    uv_read_stop(tcp_.stream());
    reading_ = false;
    if (phase_ == Phase::kReading) worker_.stats().output_pauses.fetch_add(1, std::memory_order_relaxed);
  }
}

uint64_t HttpConnection::bytes_delivered() const {
  uint64_t ours = pending_.size();
  if (tcp_) {
    ours += uv_stream_get_write_queue_size(tcp_.stream());
    uv_os_fd_t fd = -1;
    int unsent = 0;
    if (uv_fileno(tcp_.base(), &fd) == 0 && ioctl(fd, SIOCOUTQ, &unsent) == 0 && unsent > 0) {
      ours += static_cast<uint64_t>(unsent);
    }
  }
  const uint64_t total = queued_total_ + tls_extra_;  // what went (or goes) to the socket
  return total - std::min<uint64_t>(ours, total);
}

void HttpConnection::arm_flush_timer() {
  // Output queued this turn is usually all taken by the kernel when it is written at the end
  // of the turn (then the idle timer replaces this one): the mark, one ioctl, is taken then,
  // and only when something is left (flush_output).
  const bool only_pending = !pending_.empty() && (!tcp_ || uv_stream_get_write_queue_size(tcp_.stream()) == 0);
  if (only_pending) {
    timer_mode_ = TimerMode::kFlush;  // the timer itself is started by flush_output if needed
    deadline_ms_ = kNoDeadline;       // until then a running timer finds nothing to do
    flush_mark_ = kMarkAtFlush;
    return;
  }
  flush_mark_ = bytes_delivered();
  arm_timer(TimerMode::kFlush, static_cast<uint64_t>(worker_.options().keep_alive_idle.count()));
}

void HttpConnection::output_drained() {
  // Between requests with output queued (kFlush): resume parsing once below the high-water
  // mark; start the keep-alive idle time once nothing is left to write.
  if (output_blocked()) return;
  const ServerOptions& opt = worker_.options();
  if (inbuf_off_ < inbuf_.size()) {
    got_bytes_ = true;
    arm_timer(TimerMode::kHeaders, static_cast<uint64_t>(opt.header_read_timeout.count()));
    if (!processing_) process_input();
    return;
  }
  if (got_bytes_) {
    arm_timer(TimerMode::kHeaders, static_cast<uint64_t>(opt.header_read_timeout.count()));
  } else if (buffered_ == 0) {
    arm_timer(TimerMode::kIdle, static_cast<uint64_t>(opt.keep_alive_idle.count()));
  }
  update_reading();
}

void HttpConnection::flush_timer_fired() {
  if (phase_ != Phase::kReading) return;
  if (buffered_ == 0) {
    output_drained();
    return;
  }
  // Progress is what the client received since the timer was armed: one large write completes
  // only at its end, output queued after arming must not hide progress (comparing queue sizes
  // did: a head queued, then an 8 MiB body, looked like a stall), and the kernel may hold
  // megabytes the client is reading slowly while libuv's queue does not move (what it took
  // from our queue was not enough: a slow reader of an 8 MiB answer was cut).
  if (flush_mark_ == kMarkAtFlush || bytes_delivered() > flush_mark_) {
    arm_flush_timer();
    return;
  }
  worker_.stats().write_stalls.fetch_add(1, std::memory_order_relaxed);
  pdr::log::debug("http {}: client read nothing of {} queued bytes for {} ms; closing", peer_, buffered_,
                worker_.options().keep_alive_idle.count());
  close_now();
}

}  // namespace pdr::http
