#include "router/http/upstream_client.h"

#include <llhttp.h>
#include "proto/base/log.h"
#include <uv.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "router/http/host_resolver.h"
#include "router/http/tls_client.h"
#include "router/http/uv_handle.h"
#include "router/http/write_now.h"

namespace pdr::http {

namespace detail {

namespace {

constexpr size_t kReadBufferSize = 64 * 1024;

uint64_t to_ms(std::chrono::milliseconds d) { return d.count() > 0 ? static_cast<uint64_t>(d.count()) : 0; }

// RFC 9110 tchar, as a table: checked for every header name of every request.
constexpr std::array<bool, 256> kTokenChar = [] {
  std::array<bool, 256> t{};
  for (int c = 0x21; c < 0x7f; ++c) t[c] = true;
  for (char c : std::string_view(":(),;\"/[]{}\\")) t[static_cast<unsigned char>(c)] = false;
  return t;
}();

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return kTokenChar[static_cast<unsigned char>(c)]; });
}

// `host` is target.to_string(), made once per call (UpstreamCall::key_).
Status build_wire(std::string_view host, const UpstreamRequest& r, std::string* out) {
  if (!is_token(r.method)) return Status(StatusCode::kInvalidValue, "invalid HTTP method '" + r.method + "'");
  if (r.path.empty() || has_crlf_or_nul(r.path) || r.path.find(' ') != std::string::npos) {
    return Status(StatusCode::kInvalidValue, "invalid request path '" + r.path + "'");
  }
  const size_t body_size = r.append_body ? r.body_size : r.body.size();
  size_t size = r.method.size() + r.path.size() + body_size + 128;
  auto check = [&size](const std::string& name, const std::string& value) {
    if (!is_token(name)) return Status(StatusCode::kInvalidValue, "invalid header name '" + name + "'");
    if (has_crlf_or_nul(value)) {
      return Status(StatusCode::kInvalidValue, "header '" + name + "' has CR, LF or NUL in its value");
    }
    size += name.size() + value.size() + 4;
    return Status::ok();
  };
  for (const Header& h : r.headers) {
    if (Status st = check(h.name, h.value); !st) return st;
  }
  for (const auto& [name, value] : r.borrowed_headers) {
    if (Status st = check(name, value); !st) return st;
  }
  using namespace std::string_view_literals;  // literals with their length: no strlen per append
  std::string& w = *out;
  w.clear();
  w.reserve(size);
  w += r.method;
  w += ' ';
  w += r.path;
  w += " HTTP/1.1\r\nHost: "sv;
  w += host;
  w += "\r\n"sv;
  auto put = [&w](const std::string& name, const std::string& value) {
    if (is_server_managed_header(name) || iequals(name, "host")) return;
    w += name;
    w += ": "sv;
    w += value;
    w += "\r\n"sv;
  };
  for (const Header& h : r.headers) put(h.name, h.value);
  for (const auto& [name, value] : r.borrowed_headers) put(name, value);
  w += "Content-Length: "sv;
  char digits[24];
  w.append(digits, static_cast<size_t>(std::to_chars(digits, digits + sizeof digits, body_size).ptr - digits));
  w += "\r\nConnection: keep-alive\r\n\r\n"sv;
  if (!r.append_body) {
    w += r.body;
    return Status::ok();
  }
  const size_t head = w.size();
  r.append_body(&w);
  if (w.size() - head != body_size) {
    return Status(StatusCode::kInvalidValue, "request body of " + std::to_string(w.size() - head) +
                                                 " bytes, announced " + std::to_string(body_size));
  }
  return Status::ok();
}

// False when target.host is not an IP literal (a name for the resolver).
bool literal_sockaddr(const proto::HostPort& target, sockaddr_storage* out) {
  return (target.is_ipv6()
              ? uv_ip6_addr(target.host.c_str(), target.port, reinterpret_cast<sockaddr_in6*>(out))
              : uv_ip4_addr(target.host.c_str(), target.port, reinterpret_cast<sockaddr_in*>(out))) == 0;
}

// Socket creation or connect failed for a shortage in this process or host, not because of the
// node (counting these against nodes would eject every healthy node).
bool is_local_shortage(int rc) {
  return rc == UV_EMFILE || rc == UV_ENFILE || rc == UV_ENOBUFS || rc == UV_ENOMEM;
}

UpstreamFailure connect_failure(int rc) {
  return is_local_shortage(rc) ? UpstreamFailure::kLocalResources : UpstreamFailure::kConnect;
}

void set_port(sockaddr_storage* address, uint16_t port) {
  if (address->ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(address)->sin6_port = htons(port);
  } else {
    reinterpret_cast<sockaddr_in*>(address)->sin_port = htons(port);
  }
}

}  // namespace

class UpstreamConnection;

struct UpstreamPoolCore : std::enable_shared_from_this<UpstreamPoolCore> {
  uv_loop_t* loop = nullptr;
  PoolOptions options;
  PoolStats stats;
  std::vector<char> read_buffer = std::vector<char>(kReadBufferSize);
  std::unordered_map<std::string, std::vector<UpstreamConnection*>> idle;  // LIFO per address
  std::unordered_set<UpstreamConnection*> live;  // every connection not yet closing
  bool closed = false;
  // Calls whose failure was found synchronously (in start() or a retry): reported from a 0 ms
  // timer so no callback runs inside start().
  UvHandle<uv_timer_t> deferred_timer;
  std::vector<std::shared_ptr<UpstreamCall>> deferred;
  std::unique_ptr<HostResolver> resolver;  // upstreams named by hostname
  // Wire buffers of ended calls, reused by the next start(): no allocation per request for its
  // bytes once warm. Bounded in number and in the size of a buffer kept.
  static constexpr size_t kMaxSpareWires = 128, kMaxSpareWireBytes = 32 * 1024;
  std::vector<std::string> spare_wires;

  // Takes a call's wire buffer (emptied) for reuse, or frees it.
  void recycle_wire(std::string& wire) {
    if (wire.capacity() <= std::string().capacity()) return;  // no storage of its own (or given already)
    if (wire.capacity() > kMaxSpareWireBytes || spare_wires.size() >= kMaxSpareWires) {
      std::string().swap(wire);
      return;
    }
    wire.clear();
    spare_wires.push_back(std::move(wire));
    wire = std::string();
  }

  void launch(const std::shared_ptr<UpstreamCall>& call, bool allow_reuse);
  void connect_fresh(const std::shared_ptr<UpstreamCall>& call, const sockaddr_storage& address);
  void fail_later(const std::shared_ptr<UpstreamCall>& call, UpstreamFailure failure, Status error);
  void run_deferred();
  void close_all();
  static void on_deferred_timer(uv_timer_t* t);
};

// One TCP connection to one upstream address. Owned by itself: freed in its tcp handle's close
// callback, so libuv callbacks (including write completions delivered while closing) always
// find it alive. Phase kClosed means closing: nothing but close callbacks happen after it.
class UpstreamConnection {
 public:
  // Nullptr (and *rc set) if the tcp handle cannot be created.
  static UpstreamConnection* create(std::shared_ptr<UpstreamPoolCore> core, std::string key, int* rc);

  // Starts the connect for `call` (which becomes attached). Negative errno if it fails at once;
  // the call is then detached and the connection closed.
  int connect(const sockaddr* addr, const std::shared_ptr<UpstreamCall>& call);
  // Sends `call`'s request on this (connected, idle) connection.
  void attach(const std::shared_ptr<UpstreamCall>& call);
  // Cancel: forgets the call without a callback, then closes.
  void abandon();
  // close_all(): the attached call fails with kPoolClosed.
  void fail_pool_closed();
  void update_reading();
  void close();

 private:
  enum class Phase { kConnecting, kActive, kIdle, kClosed };
  enum class TimerMode { kNone, kConnect, kFirstByte, kBodyIdle, kPoolIdle };

  struct WriteReq {
    uv_write_t req{};
    UpstreamConnection* conn = nullptr;
    std::shared_ptr<UpstreamCall> call;  // owns the bytes being written (call->wire_)
  };
  // A TLS connection's ciphertext on its way to the socket (owned here, not by the call).
  struct TlsWriteReq {
    uv_write_t req{};
    UpstreamConnection* conn = nullptr;
    std::string bytes;
  };

  UpstreamConnection(std::shared_ptr<UpstreamPoolCore> core, std::string key)
      : core_(std::move(core)), key_(std::move(key)) {}

 public:
  // The TLS context the connection was opened with (null: plain) and its idle-list key
  // (UpstreamCall::pool_key(); empty: key_).
  std::shared_ptr<const TlsClientContext> tls_context_;
  std::string pool_key_;
  const std::string& pool_key() const { return pool_key_.empty() ? key_ : pool_key_; }

 private:

  static void on_connect(uv_connect_t* req, int status);
  static void on_alloc(uv_handle_t* h, size_t suggested, uv_buf_t* buf);
  static void on_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf);
  static void on_write(uv_write_t* req, int status);
  static void on_tls_write(uv_write_t* req, int status);
  static void on_timer(uv_timer_t* t);
  static int on_message_begin(llhttp_t* p);
  static int on_header_field(llhttp_t* p, const char* at, size_t len);
  static int on_header_value(llhttp_t* p, const char* at, size_t len);
  // The same two for a call that reads only Content-Type (only_content_type): other names are
  // matched against "content-type" as they arrive, not copied, and take no header entry.
  static int on_header_field_ct(llhttp_t* p, const char* at, size_t len);
  static int on_header_value_ct(llhttp_t* p, const char* at, size_t len);
  static int on_headers_complete(llhttp_t* p);
  void recycle_headers() {
    for (auto h = headers_.rbegin(); h != headers_.rend(); ++h) {  // reversed: add_header pops in order
      h->name.clear();
      h->value.clear();
      spare_headers_.push_back(std::move(*h));
    }
    headers_.clear();
  }
  void add_header() {
    if (spare_headers_.empty()) {
      headers_.emplace_back();
      return;
    }
    headers_.push_back(std::move(spare_headers_.back()));
    spare_headers_.pop_back();
  }
  static int on_body(llhttp_t* p, const char* at, size_t len);
  static int on_message_complete(llhttp_t* p);
  static const llhttp_settings_t* parser_settings(bool only_content_type);
  static llhttp_settings_t make_parser_settings(bool only_content_type);
  static UpstreamConnection* from_parser(llhttp_t* p) { return static_cast<UpstreamConnection*>(p->data); }

  void begin_exchange();
  void handle_read(ssize_t nread, const uv_buf_t* buf);
  // The response bytes (plaintext) of one read, or its error/EOF (nread < 0, data unused).
  void handle_plain(ssize_t nread, const char* data);
  // TLS only: starts the handshake once TCP is connected; decrypts one socket read; sends
  // whatever ciphertext the session produced.
  void start_tls();
  void handle_tls_read(ssize_t nread, const uv_buf_t* buf);
  void flush_tls();
  void fail_tls(UpstreamFailure failure, const Status& error);
  void handle_timeout();
  void complete(bool extra_bytes);
  void fail(UpstreamFailure failure, Status error);
  void return_to_pool();
  void arm_timer(TimerMode mode, uint64_t ms);
  void start_timer(uint64_t ms);
  bool attached(const std::shared_ptr<UpstreamCall>& call) const {
    return phase_ == Phase::kActive && call_ == call;
  }

  std::shared_ptr<UpstreamPoolCore> core_;
  std::string key_;
  UvHandle<uv_tcp_t> tcp_;
  UvHandle<uv_timer_t> timer_;
  uv_connect_t connect_req_{};
  Phase phase_ = Phase::kConnecting;
  TimerMode timer_mode_ = TimerMode::kNone;
  // The timer is lazy: a mode's timeout is due at deadline_ms_ (loop time), and the libuv timer
  // runs with a due time (timer_due_ms_) at or before every pending deadline. A new deadline
  // later than the running timer's only moves deadline_ms_ (no timer-heap work: a leg's first
  // byte, body and pool idle periods follow each other on every call); the timer, when it fires
  // early, re-arms for what is left. kBodyIdle: each read moves the deadline the same way.
  // Mode kNone leaves the timer running; it fires once and finds nothing to do.
  uint64_t deadline_ms_ = 0;
  uint64_t timer_due_ms_ = 0;
  bool timer_running_ = false;
  bool reading_ = false;
  bool writing_ = false;
  // TLS connections only (the pool has a TlsClientContext); null on the plain data path.
  std::unique_ptr<TlsSession> tls_;
  bool handshaking_ = false;
  size_t tls_writes_ = 0;  // TlsWriteReqs in flight

  std::shared_ptr<UpstreamCall> call_;
  llhttp_t parser_{};
  int status_ = 0;
  std::vector<Header> headers_;
  // Emptied headers of earlier responses on this connection, reused with their capacity: the
  // next response from the same node usually has the same headers (no allocation per head).
  std::vector<Header> spare_headers_;
  bool in_header_value_ = false;
  // only_content_type: a field name of this head has begun; how many bytes of the current name
  // match "content-type" (kNameMismatch: it does not), those bytes as sent, and whether the
  // current value is Content-Type's (kept).
  static constexpr uint8_t kNameMismatch = 0xff;
  bool field_seen_ = false;
  uint8_t ct_matched_ = 0;
  char ct_name_[12] = {};
  bool keep_value_ = false;
  bool interim_ = false;      // parsing a 1xx response
  bool message_done_ = false;
  bool got_bytes_ = false;    // a byte of this call's response arrived
  bool head_request_ = false;
  size_t head_bytes_ = 0;     // of the response head being parsed
  size_t head_fields_ = 0;
  size_t interim_count_ = 0;  // 1xx heads of this call
  const char* limit_error_ = nullptr;  // set when a response-head limit stopped the parser
};

// ---------------------------------------------------------------------------------------------
// UpstreamConnection

UpstreamConnection* UpstreamConnection::create(std::shared_ptr<UpstreamPoolCore> core, std::string key,
                                               int* rc) {
  auto* c = new UpstreamConnection(std::move(core), std::move(key));
  uv_loop_t* loop = c->core_->loop;
  *rc = c->tcp_.init(c, [&](uv_tcp_t* h) { return uv_tcp_init(loop, h); });
  if (*rc < 0) {
    delete c;
    return nullptr;
  }
  *rc = c->timer_.init(c, [&](uv_timer_t* t) { return uv_timer_init(loop, t); });
  if (*rc < 0) {
    c->tcp_.close([c] { delete c; });
    return nullptr;
  }
  c->connect_req_.data = c;
  c->core_->live.insert(c);
  return c;
}

int UpstreamConnection::connect(const sockaddr* addr, const std::shared_ptr<UpstreamCall>& call) {
  call_ = call;
  call->conn_ = this;
  phase_ = Phase::kConnecting;
  const int rc = uv_tcp_connect(&connect_req_, tcp_.get(), addr, &UpstreamConnection::on_connect);
  if (rc < 0) {
    call_->conn_ = nullptr;
    call_.reset();
    close();
    return rc;
  }
  arm_timer(TimerMode::kConnect, to_ms(call->timeouts_.connect));
  return 0;
}

void UpstreamConnection::on_connect(uv_connect_t* req, int status) {
  auto* c = static_cast<UpstreamConnection*>(req->data);
  if (status == UV_ECANCELED || c->phase_ == Phase::kClosed) return;
  if (status < 0) {
    c->fail(connect_failure(status),
            Status(StatusCode::kIoError, "connect to " + c->key_ + ": " + uv_strerror(status)));
    return;
  }
  uv_tcp_nodelay(c->tcp_.get(), 1);
  if (c->tls_context_) {
    c->start_tls();
    return;
  }
  c->phase_ = Phase::kActive;
  c->begin_exchange();
}

void UpstreamConnection::attach(const std::shared_ptr<UpstreamCall>& call) {
  call_ = call;
  call->conn_ = this;
  phase_ = Phase::kActive;
  begin_exchange();
}

void UpstreamConnection::begin_exchange() {
  llhttp_init(&parser_, HTTP_RESPONSE, parser_settings(call_->only_content_type_));
  parser_.data = this;
  status_ = 0;
  recycle_headers();
  in_header_value_ = false;
  field_seen_ = false;
  interim_ = false;
  message_done_ = false;
  got_bytes_ = false;
  head_request_ = call_->wire_.starts_with("HEAD ");
  head_bytes_ = 0;
  head_fields_ = 0;
  interim_count_ = 0;
  limit_error_ = nullptr;

  if (tls_) {
    // Encrypted as a copy: the wire bytes stay in the call for the one retry, as below.
    if (Status st = tls_->write(call_->wire_); !st) {
      fail_tls(UpstreamFailure::kConnectionLost, st);
      return;
    }
    flush_tls();
    if (phase_ != Phase::kActive) return;
    arm_timer(TimerMode::kFirstByte, to_ms(call_->timeouts_.first_byte));
    update_reading();
    return;
  }
  // Most requests fit the socket buffer: written at once, no uv_write (write_now.h). The wire
  // bytes stay in the call either way (a stale pooled connection is retried once with them).
  const size_t taken = detail::write_now(tcp_.stream(), call_->wire_);
  if (taken == call_->wire_.size()) {
    writing_ = false;
    arm_timer(TimerMode::kFirstByte, to_ms(call_->timeouts_.first_byte));
    update_reading();
    return;
  }
  auto* w = new WriteReq;
  w->conn = this;
  w->call = call_;
  w->req.data = w;
  uv_buf_t buf = uv_buf_init(call_->wire_.data() + taken, static_cast<unsigned>(call_->wire_.size() - taken));
  const int rc = uv_write(&w->req, tcp_.stream(), &buf, 1, &UpstreamConnection::on_write);
  if (rc < 0) {
    delete w;
    fail(UpstreamFailure::kConnectionLost,
         Status(StatusCode::kIoError, "write to " + key_ + ": " + uv_strerror(rc)));
    return;
  }
  writing_ = true;
  arm_timer(TimerMode::kFirstByte, to_ms(call_->timeouts_.first_byte));
  update_reading();
}

void UpstreamConnection::on_write(uv_write_t* req, int status) {
  auto* w = static_cast<WriteReq*>(req->data);
  UpstreamConnection* c = w->conn;
  std::shared_ptr<UpstreamCall> call = std::move(w->call);
  delete w;
  if (status == UV_ECANCELED || c->phase_ == Phase::kClosed) return;
  c->writing_ = false;
  if (status < 0 && c->attached(call)) {
    c->fail(UpstreamFailure::kConnectionLost,
            Status(StatusCode::kIoError, "write to " + c->key_ + ": " + uv_strerror(status)));
    return;
  }
  if (c->got_bytes_ && c->attached(call)) c->core_->recycle_wire(call->wire_);  // no retry any more
}

void UpstreamConnection::update_reading() {
  if (phase_ == Phase::kClosed) return;
  bool want = false;
  if (phase_ == Phase::kIdle) want = true;  // notice the upstream closing a pooled connection
  if (handshaking_) want = true;            // the handshake runs whatever the call wants
  if (phase_ == Phase::kActive) want = !(call_ && call_->paused_);
  if (want && !reading_) {
    if (uv_read_start(tcp_.stream(), &UpstreamConnection::on_alloc, &UpstreamConnection::on_read) == 0) {
      reading_ = true;
    }
  } else if (!want && reading_) {
    uv_read_stop(tcp_.stream());
    reading_ = false;
  }
  if (phase_ == Phase::kActive) {
    if (!reading_) {
      arm_timer(TimerMode::kNone, 0);
    } else if (timer_mode_ == TimerMode::kNone) {
      if (got_bytes_) {
        arm_timer(TimerMode::kBodyIdle, to_ms(call_->timeouts_.idle));
      } else {
        arm_timer(TimerMode::kFirstByte, to_ms(call_->timeouts_.first_byte));
      }
    }
  }
}

void UpstreamConnection::on_alloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
  auto* c = UvHandle<uv_tcp_t>::owner_of<UpstreamConnection>(h);
  buf->base = c->core_->read_buffer.data();
  buf->len = c->core_->read_buffer.size();
}

void UpstreamConnection::on_read(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
  UvHandle<uv_tcp_t>::owner_of<UpstreamConnection>(s)->handle_read(nread, buf);
}

void UpstreamConnection::handle_read(ssize_t nread, const uv_buf_t* buf) {
  if (nread == 0 || phase_ == Phase::kClosed) return;
  if (tls_) {
    handle_tls_read(nread, buf);
    return;
  }
  handle_plain(nread, nread > 0 ? buf->base : nullptr);
}

void UpstreamConnection::handle_plain(ssize_t nread, const char* data) {
  if (phase_ == Phase::kIdle) {
    // The upstream closed (or sent unsolicited bytes on) a pooled connection: drop it.
    close();
    return;
  }
  if (phase_ != Phase::kActive || !call_) return;
  std::shared_ptr<UpstreamCall> call = call_;
  if (nread < 0) {
    if (nread == UV_EOF && got_bytes_) {
      // A close-delimited body ends here; anything else is a truncated response.
      const llhttp_errno_t fin = llhttp_finish(&parser_);
      if ((fin == HPE_OK || fin == HPE_PAUSED) && message_done_) {
        complete(false);
        return;
      }
      if (!attached(call)) return;
    }
    fail(UpstreamFailure::kConnectionLost,
         Status(StatusCode::kIoError,
                "upstream " + key_ + " closed the connection before the response was complete" +
                    (nread == UV_EOF ? std::string() : std::string(" (") + uv_strerror(static_cast<int>(nread)) + ")")));
    return;
  }
  if (!got_bytes_ && !writing_) core_->recycle_wire(call->wire_);  // the retry is over: the copy is not needed
  got_bytes_ = true;
  if (timer_mode_ == TimerMode::kBodyIdle) {
    uv_update_time(core_->loop);  // fresh, as arm_timer() would take it
    deadline_ms_ = uv_now(core_->loop) + to_ms(call->timeouts_.idle);
  } else {
    arm_timer(TimerMode::kBodyIdle, to_ms(call->timeouts_.idle));
  }
  const llhttp_errno_t err = llhttp_execute(&parser_, data, static_cast<size_t>(nread));
  if (!attached(call)) return;  // a callback cancelled the call (or the pool closed)
  if (err == HPE_PAUSED && message_done_) {
    const char* pos = llhttp_get_error_pos(&parser_);
    complete(pos != nullptr && pos < data + nread);
    return;
  }
  if (err != HPE_OK && limit_error_ != nullptr) {
    ++core_->stats.oversized_heads;
    fail(UpstreamFailure::kBadResponse,
         Status(StatusCode::kMalformed, "response from " + key_ + " refused: " + limit_error_));
    return;
  }
  if (err != HPE_OK) {
    const char* reason = llhttp_get_error_reason(&parser_);
    fail(UpstreamFailure::kBadResponse,
         Status(StatusCode::kMalformed, std::string("malformed response from ") + key_ + " (" +
                                            llhttp_errno_name(err) + "): " + (reason ? reason : "")));
  }
}

// TLS -----------------------------------------------------------------------------------------

void UpstreamConnection::start_tls() {
  // The connect timer keeps running: it covers the handshake too.
  if (Status st = TlsSession::create(*tls_context_, call_->target_.host, &tls_); !st) {
    fail_tls(UpstreamFailure::kConnect, st);
    return;
  }
  handshaking_ = true;
  Status error;
  if (tls_->handshake(&error) == TlsSession::Step::kFailed) {  // writes the ClientHello
    fail_tls(UpstreamFailure::kConnect, error);
    return;
  }
  flush_tls();
  update_reading();
}

void UpstreamConnection::handle_tls_read(ssize_t nread, const uv_buf_t* buf) {
  if (nread < 0) {
    if (handshaking_) {
      count_tls_error(TlsErrorReason::kHandshake);
      fail_tls(UpstreamFailure::kConnect,
               Status(StatusCode::kIoError, std::string("tls: handshake failed: connection closed by the peer") +
                                                (nread == UV_EOF ? "" : std::string(" (") +
                                                                            uv_strerror(static_cast<int>(nread)) + ")")));
      return;
    }
    handle_plain(nread, nullptr);
    return;
  }
  tls_->feed(std::string_view(buf->base, static_cast<size_t>(nread)));
  if (handshaking_) {
    Status error;
    const TlsSession::Step step = tls_->handshake(&error);
    if (step == TlsSession::Step::kFailed) {
      flush_tls();  // the alert tells the peer why
      fail_tls(UpstreamFailure::kConnect, error);
      return;
    }
    flush_tls();
    if (step == TlsSession::Step::kPending || phase_ == Phase::kClosed) return;
    handshaking_ = false;
    phase_ = Phase::kActive;
    begin_exchange();
    if (phase_ == Phase::kClosed) return;
  }
  // The socket read is in the session now, so the pool's read buffer takes the plaintext. One
  // read's records are all decrypted here (about one read of plaintext, as for plain TCP).
  std::vector<char>& plain = core_->read_buffer;
  for (;;) {
    size_t n = 0;
    Status error;
    const TlsSession::Read r = tls_->read(std::span<char>(plain.data(), plain.size()), &n, &error);
    if (r == TlsSession::Read::kWantMore) break;
    if (r == TlsSession::Read::kFailed) {
      fail_tls(UpstreamFailure::kConnectionLost, error);
      return;
    }
    if (r == TlsSession::Read::kClosed) {  // close_notify: an end of stream like EOF
      handle_plain(UV_EOF, nullptr);
      return;
    }
    handle_plain(static_cast<ssize_t>(n), plain.data());
    if (phase_ == Phase::kClosed) return;
  }
  flush_tls();  // post-handshake messages may need an answer
}

void UpstreamConnection::flush_tls() {
  if (phase_ == Phase::kClosed || !tls_->has_output()) return;
  std::string bytes = tls_->take_output();
  const size_t taken = detail::write_now(tcp_.stream(), bytes);
  if (taken == bytes.size()) return;
  auto* w = new TlsWriteReq;
  w->conn = this;
  w->req.data = w;
  w->bytes = bytes.substr(taken);
  uv_buf_t buf = uv_buf_init(w->bytes.data(), static_cast<unsigned>(w->bytes.size()));
  const int rc = uv_write(&w->req, tcp_.stream(), &buf, 1, &UpstreamConnection::on_tls_write);
  if (rc < 0) {
    delete w;
    fail(handshaking_ ? UpstreamFailure::kConnect : UpstreamFailure::kConnectionLost,
         Status(StatusCode::kIoError, "write to " + key_ + ": " + uv_strerror(rc)));
    return;
  }
  ++tls_writes_;
  writing_ = true;
}

void UpstreamConnection::on_tls_write(uv_write_t* req, int status) {
  auto* w = static_cast<TlsWriteReq*>(req->data);
  UpstreamConnection* c = w->conn;
  delete w;
  if (status == UV_ECANCELED || c->phase_ == Phase::kClosed) return;
  if (--c->tls_writes_ == 0) c->writing_ = false;
  if (status < 0) {
    c->fail(c->handshaking_ ? UpstreamFailure::kConnect : UpstreamFailure::kConnectionLost,
            Status(StatusCode::kIoError, "write to " + c->key_ + ": " + uv_strerror(status)));
    return;
  }
  if (!c->writing_ && c->got_bytes_ && c->call_) std::string().swap(c->call_->wire_);  // no retry any more
}

void UpstreamConnection::fail_tls(UpstreamFailure failure, const Status& error) {
  fail(failure, Status(error.code(), "upstream " + key_ + ": " + error.message()));
}

void UpstreamConnection::arm_timer(TimerMode mode, uint64_t ms) {
  if (!timer_) return;
  timer_mode_ = TimerMode::kNone;  // a running timer stays: see deadline_ms_
  if (mode == TimerMode::kNone || ms == 0) return;
  timer_mode_ = mode;
  // The loop clock is cached per iteration; refresh it so a timeout armed late in a busy
  // iteration (or from start() outside a callback) is not cut short by the stale time.
  uv_update_time(core_->loop);
  deadline_ms_ = uv_now(core_->loop) + ms;
  if (timer_running_ && timer_due_ms_ <= deadline_ms_) return;  // fires first, re-arms for the rest
  start_timer(ms);
}

void UpstreamConnection::start_timer(uint64_t ms) {
  uv_timer_start(timer_.get(), &UpstreamConnection::on_timer, ms, 0);  // replaces a running one
  timer_running_ = true;
  timer_due_ms_ = uv_now(core_->loop) + ms;  // libuv's own due time: loop time + ms
}

void UpstreamConnection::on_timer(uv_timer_t* t) {
  UvHandle<uv_timer_t>::owner_of<UpstreamConnection>(t)->handle_timeout();
}

void UpstreamConnection::handle_timeout() {
  timer_running_ = false;
  if (timer_mode_ == TimerMode::kNone) return;
  if (const uint64_t now = uv_now(core_->loop); now < deadline_ms_) {
    start_timer(deadline_ms_ - now);  // armed before the deadline moved on: wait for the rest
    return;
  }
  const TimerMode mode = std::exchange(timer_mode_, TimerMode::kNone);
  switch (mode) {
    case TimerMode::kNone:
      return;
    case TimerMode::kPoolIdle:
      close();
      return;
    case TimerMode::kConnect:
      fail(UpstreamFailure::kConnectTimeout,
           Status(StatusCode::kIoError, "connect to " + key_ + ": timeout after " +
                                            std::to_string(call_->timeouts_.connect.count()) + " ms"));
      return;
    case TimerMode::kFirstByte:
      fail(UpstreamFailure::kFirstByteTimeout,
           Status(StatusCode::kIoError, "upstream " + key_ + ": no response byte within " +
                                            std::to_string(call_->timeouts_.first_byte.count()) + " ms (timeout)"));
      return;
    case TimerMode::kBodyIdle:
      fail(UpstreamFailure::kIdleTimeout,
           Status(StatusCode::kIoError, "upstream " + key_ + ": response idle for " +
                                            std::to_string(call_->timeouts_.idle.count()) + " ms (timeout)"));
      return;
  }
}

void UpstreamConnection::complete(bool extra_bytes) {
  std::shared_ptr<UpstreamCall> call = std::move(call_);
  call->conn_ = nullptr;
  const bool reusable = llhttp_should_keep_alive(&parser_) != 0 && !extra_bytes && !writing_ &&
                        !core_->closed && !head_request_;
  // Back to the pool before on_complete, so a call started from it can reuse this connection.
  if (reusable) {
    return_to_pool();
  } else {
    close();
  }
  call->finish_ok();
}

void UpstreamConnection::fail(UpstreamFailure failure, Status error) {
  std::shared_ptr<UpstreamCall> call = std::move(call_);
  if (call) call->conn_ = nullptr;
  close();
  if (!call) return;
  if (failure == UpstreamFailure::kConnect || failure == UpstreamFailure::kConnectTimeout) {
    core_->resolver->forget(call->target_.host);  // a node that moved: look its name up again
  }
  if (failure == UpstreamFailure::kConnectionLost && call->reused_ && !got_bytes_ && !call->retried_) {
    // Stale pooled connection (see the header): retry once on a fresh one.
    call->retried_ = true;
    call->reused_ = false;
    ++core_->stats.retries;
    pdr::log::debug("upstream {}: pooled connection was closed ({}); retrying on a fresh one", key_,
                  error.message());
    core_->launch(call, /*allow_reuse=*/false);
    return;
  }
  call->finish_error(failure, std::move(error));
}

void UpstreamConnection::abandon() {
  if (call_) call_->conn_ = nullptr;
  call_.reset();
  close();
}

void UpstreamConnection::fail_pool_closed() {
  std::shared_ptr<UpstreamCall> call = std::move(call_);
  if (call) call->conn_ = nullptr;
  close();
  if (call) call->finish_error(UpstreamFailure::kPoolClosed, Status(StatusCode::kIoError, "upstream pool closed"));
}

void UpstreamConnection::return_to_pool() {
  auto& list = core_->idle[pool_key()];
  if (list.size() >= core_->options.max_idle_per_host) {
    close();
    return;
  }
  phase_ = Phase::kIdle;
  list.push_back(this);
  ++core_->stats.idle;
  arm_timer(TimerMode::kPoolIdle, to_ms(core_->options.idle_timeout));
  update_reading();
}

void UpstreamConnection::close() {
  if (phase_ == Phase::kClosed) return;
  if (phase_ == Phase::kIdle) {
    auto it = core_->idle.find(pool_key());
    if (it != core_->idle.end()) {
      auto& v = it->second;
      v.erase(std::remove(v.begin(), v.end(), this), v.end());
      if (v.empty()) core_->idle.erase(it);
    }
    --core_->stats.idle;
  }
  phase_ = Phase::kClosed;
  reading_ = false;
  timer_mode_ = TimerMode::kNone;
  timer_running_ = false;
  core_->live.erase(this);
  timer_.close();
  tcp_.close([this] { delete this; });
}

// llhttp glue ---------------------------------------------------------------------------------

const llhttp_settings_t* UpstreamConnection::parser_settings(bool only_content_type) {
  static const llhttp_settings_t all = make_parser_settings(false);
  static const llhttp_settings_t content_type = make_parser_settings(true);
  return only_content_type ? &content_type : &all;
}

llhttp_settings_t UpstreamConnection::make_parser_settings(bool only_content_type) {
  llhttp_settings_t s;
  llhttp_settings_init(&s);
  s.on_message_begin = &UpstreamConnection::on_message_begin;
  s.on_header_field = only_content_type ? &UpstreamConnection::on_header_field_ct : &UpstreamConnection::on_header_field;
  s.on_header_value = only_content_type ? &UpstreamConnection::on_header_value_ct : &UpstreamConnection::on_header_value;
  s.on_headers_complete = &UpstreamConnection::on_headers_complete;
  s.on_body = &UpstreamConnection::on_body;
  s.on_message_complete = &UpstreamConnection::on_message_complete;
  return s;
}

int UpstreamConnection::on_message_begin(llhttp_t* p) {
  UpstreamConnection* c = from_parser(p);
  c->recycle_headers();
  c->in_header_value_ = false;
  c->field_seen_ = false;
  c->interim_ = false;
  c->head_bytes_ = 0;
  c->head_fields_ = 0;
  return 0;
}

// One more header field in the response head (both callback sets count fields alike).
static bool add_head_field(size_t* fields, const char** error) {
  static_assert(kMaxResponseHeaders == 100, "update the message below");
  if (++*fields <= kMaxResponseHeaders) return true;
  *error = "more than 100 response header fields";
  return false;
}

// Counts `len` head bytes; false (and the reason set) once over kMaxResponseHeaderBytes.
static bool add_head_bytes(size_t* bytes, size_t len, const char** error) {
  static_assert(kMaxResponseHeaderBytes == 65536, "update the message below");
  *bytes += len;
  if (*bytes <= kMaxResponseHeaderBytes) return true;
  *error = "response headers over 65536 bytes";
  return false;
}

int UpstreamConnection::on_header_field(llhttp_t* p, const char* at, size_t len) {
  UpstreamConnection* c = from_parser(p);
  if (c->in_header_value_ || c->headers_.empty()) {
    if (!add_head_field(&c->head_fields_, &c->limit_error_)) return HPE_USER;
    c->add_header();
    c->in_header_value_ = false;
  }
  if (!add_head_bytes(&c->head_bytes_, len + 4, &c->limit_error_)) return HPE_USER;
  c->headers_.back().name.append(at, len);
  return 0;
}

int UpstreamConnection::on_header_value(llhttp_t* p, const char* at, size_t len) {
  UpstreamConnection* c = from_parser(p);
  if (!add_head_bytes(&c->head_bytes_, len, &c->limit_error_)) return HPE_USER;
  if (!c->in_header_value_) {  // the value's first piece: the name is complete
    c->in_header_value_ = true;
    if (c->headers_.empty()) c->add_header();
  }
  c->headers_.back().value.append(at, len);
  return 0;
}

int UpstreamConnection::on_header_field_ct(llhttp_t* p, const char* at, size_t len) {
  static constexpr std::string_view kName = "content-type";
  UpstreamConnection* c = from_parser(p);
  if (c->in_header_value_ || !c->field_seen_) {  // a new field, as on_header_field counts them
    if (!add_head_field(&c->head_fields_, &c->limit_error_)) return HPE_USER;
    c->field_seen_ = true;
    c->in_header_value_ = false;
    c->ct_matched_ = 0;
  }
  if (!add_head_bytes(&c->head_bytes_, len + 4, &c->limit_error_)) return HPE_USER;
  const size_t matched = c->ct_matched_;
  if (matched != kNameMismatch) {
    if (len <= kName.size() - matched && iequals(std::string_view(at, len), kName.substr(matched, len))) {
      std::memcpy(c->ct_name_ + matched, at, len);
      c->ct_matched_ = static_cast<uint8_t>(matched + len);
    } else {
      c->ct_matched_ = kNameMismatch;
    }
  }
  return 0;
}

int UpstreamConnection::on_header_value_ct(llhttp_t* p, const char* at, size_t len) {
  UpstreamConnection* c = from_parser(p);
  if (!add_head_bytes(&c->head_bytes_, len, &c->limit_error_)) return HPE_USER;
  if (!c->in_header_value_) {  // the value's first piece: the name is complete
    c->in_header_value_ = true;
    c->field_seen_ = true;
    c->keep_value_ = c->ct_matched_ == sizeof(c->ct_name_);
    if (c->keep_value_) {
      c->add_header();
      c->headers_.back().name.assign(c->ct_name_, sizeof(c->ct_name_));
    }
  }
  if (c->keep_value_) c->headers_.back().value.append(at, len);
  return 0;
}

int UpstreamConnection::on_headers_complete(llhttp_t* p) {
  UpstreamConnection* c = from_parser(p);
  const int status = p->status_code;
  if (status == 101) {
    llhttp_set_error_reason(p, "unexpected 101 Switching Protocols");
    return -1;
  }
  if (status >= 100 && status < 200) {
    if (++c->interim_count_ > kMaxInterimResponses) {
      c->limit_error_ = "more than 10 interim (1xx) responses";
      return HPE_USER;
    }
    c->interim_ = true;  // 100 Continue / 103 Early Hints: the final response follows
    return 0;
  }
  c->status_ = status;
  std::shared_ptr<UpstreamCall> call = c->call_;
  call->fire(call->callbacks_.on_head, "on_head", status, c->headers_);
  if (!c->attached(call)) return -1;
  return c->head_request_ ? 1 : 0;  // 1: a HEAD response has no body whatever it says
}

int UpstreamConnection::on_body(llhttp_t* p, const char* at, size_t len) {
  UpstreamConnection* c = from_parser(p);
  std::shared_ptr<UpstreamCall> call = c->call_;
  call->fire(call->callbacks_.on_body, "on_body", std::string_view(at, len));
  return c->attached(call) ? 0 : -1;
}

int UpstreamConnection::on_message_complete(llhttp_t* p) {
  UpstreamConnection* c = from_parser(p);
  if (c->interim_) {
    c->interim_ = false;
    return 0;
  }
  // Pause so execute() stops right after the response: bytes after it mean the connection is
  // not in a state we can reuse.
  c->message_done_ = true;
  return HPE_PAUSED;
}

// ---------------------------------------------------------------------------------------------
// UpstreamPoolCore

void UpstreamPoolCore::launch(const std::shared_ptr<UpstreamCall>& call, bool allow_reuse) {
  if (closed) {
    fail_later(call, UpstreamFailure::kPoolClosed, Status(StatusCode::kIoError, "upstream pool closed"));
    return;
  }
  if (allow_reuse) {
    auto it = idle.find(call->pool_key());
    if (it != idle.end() && !it->second.empty()) {
      UpstreamConnection* conn = it->second.back();
      it->second.pop_back();
      if (it->second.empty()) idle.erase(it);
      --stats.idle;
      ++stats.reuses;
      call->reused_ = true;
      conn->attach(call);
      return;
    }
  }
  if (call->target_.port == 0) {
    fail_later(call, UpstreamFailure::kBadRequest, Status(StatusCode::kBadAddress, "upstream port 0"));
    return;
  }
  sockaddr_storage addr{};
  if (literal_sockaddr(call->target_, &addr)) {
    connect_fresh(call, addr);
    return;
  }
  const std::string& host = call->target_.host;
  if (resolver->cached(host, &addr)) {
    set_port(&addr, call->target_.port);
    connect_fresh(call, addr);
    return;
  }
  // The call is held until the answer; cancel() meanwhile just marks it done.
  Status started = resolver->resolve(
      host, [call, weak = weak_from_this()](const Status& error, const sockaddr_storage& found) {
        std::shared_ptr<UpstreamPoolCore> core = weak.lock();
        if (!core || call->done()) return;
        if (core->closed) {
          call->finish_error(UpstreamFailure::kPoolClosed, Status(StatusCode::kIoError, "upstream pool closed"));
        } else if (!error) {
          call->finish_error(UpstreamFailure::kConnect,
                             Status(error.code(), "connect to " + call->key_ + ": " + error.message()));
        } else {
          sockaddr_storage address = found;
          set_port(&address, call->target_.port);
          core->connect_fresh(call, address);
        }
      });
  if (!started) {
    fail_later(call, UpstreamFailure::kConnect,
               Status(started.code(), "connect to " + call->key_ + ": " + started.message()));
  }
}

void UpstreamPoolCore::connect_fresh(const std::shared_ptr<UpstreamCall>& call, const sockaddr_storage& addr) {
  ++stats.connects;
  int rc = 0;
  UpstreamConnection* conn = UpstreamConnection::create(shared_from_this(), call->key_, &rc);
  if (conn != nullptr) {
    conn->tls_context_ = call->tls_;
    conn->pool_key_ = call->pool_key_;
    rc = conn->connect(reinterpret_cast<const sockaddr*>(&addr), call);
  }
  if (rc < 0) {
    const UpstreamFailure failure = connect_failure(rc);
    if (failure == UpstreamFailure::kLocalResources) {
      fail_later(call, failure,
                 Status(StatusCode::kIoError, "no local resources to connect to " + call->key_ + ": " +
                                                  uv_strerror(rc) + " (a limit of this router, not the node)"));
      return;
    }
    fail_later(call, failure, Status(StatusCode::kIoError, "connect to " + call->key_ + ": " + uv_strerror(rc)));
  }
}

void UpstreamPoolCore::fail_later(const std::shared_ptr<UpstreamCall>& call, UpstreamFailure failure,
                                  Status error) {
  call->failure_ = failure;
  call->pending_error_ = std::move(error);
  deferred.push_back(call);
  if (deferred_timer) uv_timer_start(deferred_timer.get(), &UpstreamPoolCore::on_deferred_timer, 0, 0);
}

void UpstreamPoolCore::on_deferred_timer(uv_timer_t* t) {
  UvHandle<uv_timer_t>::owner_of<UpstreamPoolCore>(t)->run_deferred();
}

void UpstreamPoolCore::run_deferred() {
  std::vector<std::shared_ptr<UpstreamCall>> calls = std::move(deferred);
  deferred.clear();
  for (auto& call : calls) call->finish_error(call->failure_, std::move(call->pending_error_));
}

void UpstreamPoolCore::close_all() {
  closed = true;
  if (resolver) resolver->close();  // calls waiting for a name fail with kPoolClosed
  std::vector<UpstreamConnection*> conns(live.begin(), live.end());
  for (UpstreamConnection* c : conns) {
    if (live.count(c) != 0) c->fail_pool_closed();
  }
  // An on_error above may start() again; those calls fail here too, so none is left waiting.
  while (!deferred.empty()) run_deferred();
}

}  // namespace detail

// -----------------------------------------------------------------------------------------------
// UpstreamCall

bool is_timeout(UpstreamFailure failure) {
  return failure == UpstreamFailure::kConnectTimeout || failure == UpstreamFailure::kFirstByteTimeout ||
         failure == UpstreamFailure::kIdleTimeout;
}

namespace {
// Releases the four callbacks and keep_alive, in that order (what `cb = UpstreamCallbacks{}`
// does, without building and moving from a temporary per call).
void release_callbacks(UpstreamCallbacks& cb) {
  cb.on_head = nullptr;
  cb.on_body = nullptr;
  cb.on_complete = nullptr;
  cb.on_error = nullptr;
  cb.keep_alive.reset();
}
}  // namespace

UpstreamCall::~UpstreamCall() = default;

template <typename Fn, typename... Args>
void UpstreamCall::fire(Fn& fn, const char* what, Args&&... args) {
  if (!fn) return;
  ++in_callback_;
  try {
    fn(std::forward<Args>(args)...);
  } catch (const std::exception& e) {
    pdr::log::error("upstream {}: {} callback threw: {}", key_, what, e.what());
    cancel();
  } catch (...) {
    pdr::log::error("upstream {}: {} callback threw a non-std exception", key_, what);
    cancel();
  }
  --in_callback_;
  if (state_ == State::kDone && in_callback_ == 0) release_callbacks(callbacks_);
}

void UpstreamCall::end(bool cancelled, bool error) {
  state_ = State::kDone;
  // Its connection is closed or back in the pool by now: no write can still read the copy.
  auto core = core_.lock();
  if (core) {
    core->recycle_wire(wire_);
  } else {
    std::string().swap(wire_);
  }
  if (core) {
    --core->stats.active;
    if (cancelled) ++core->stats.cancels;
    if (error) {
      ++core->stats.errors;
      if (failure_ == UpstreamFailure::kLocalResources) ++core->stats.local_errors;
      if (is_timeout(failure_)) ++core->stats.timeouts;
    }
  }
}

void UpstreamCall::finish_ok() {
  if (state_ == State::kDone) return;
  end(false, false);
  fire(callbacks_.on_complete, "on_complete");
}

void UpstreamCall::finish_error(UpstreamFailure failure, Status error) {
  if (state_ == State::kDone) return;
  failure_ = failure;
  end(false, true);
  pdr::log::debug("upstream {}: call failed: {}", key_, error.to_string());
  fire(callbacks_.on_error, "on_error", error);
}

void UpstreamCall::cancel() {
  if (state_ == State::kDone) return;
  end(true, false);
  if (conn_ != nullptr) conn_->abandon();
  if (in_callback_ == 0) release_callbacks(callbacks_);
}

void UpstreamCall::pause() {
  if (paused_ || state_ == State::kDone) return;
  paused_ = true;
  if (conn_ != nullptr) conn_->update_reading();
}

void UpstreamCall::resume() {
  if (!paused_) return;
  paused_ = false;
  if (conn_ != nullptr && state_ != State::kDone) conn_->update_reading();
}

// -----------------------------------------------------------------------------------------------
// UpstreamPool

UpstreamPool::UpstreamPool(uv_loop_s* loop, PoolOptions options)
    : core_(std::make_shared<detail::UpstreamPoolCore>()) {
  core_->loop = loop;
  core_->options = options;
  core_->resolver = std::make_unique<HostResolver>(loop, options.dns_ttl, options.resolve_timeout);
  const int rc = core_->deferred_timer.init(core_.get(), [&](uv_timer_t* t) { return uv_timer_init(loop, t); });
  if (rc < 0) pdr::log::error("upstream pool: uv_timer_init failed: {}", uv_strerror(rc));
}

UpstreamPool::~UpstreamPool() {
  close_all();
  core_->deferred_timer.close();
}

std::shared_ptr<UpstreamCall> UpstreamPool::start(const proto::HostPort& target, UpstreamRequest&& request,
                                                  UpstreamTimeouts timeouts, UpstreamCallbacks&& callbacks) {
  // One allocation with its count; the callbacks moved straight into it.
  auto call = std::make_shared<UpstreamCall>(UpstreamCall::Key{}, std::move(callbacks));
  call->core_ = core_;
  call->target_ = target;
  call->key_ = target.to_string();
  if (request.tls) {
    // Connections of another context (or plain ones) to the same address are not this call's.
    char id[2 + 2 * sizeof(void*) + 1];
    std::snprintf(id, sizeof id, "#%p", static_cast<const void*>(request.tls.get()));
    call->pool_key_ = call->key_ + id;
    call->tls_ = std::move(request.tls);
  } else {
    call->tls_ = core_->options.tls;
  }
  call->timeouts_ = timeouts;
  call->only_content_type_ = request.only_content_type;
  call->state_ = UpstreamCall::State::kRunning;
  ++core_->stats.active;
  if (!core_->spare_wires.empty()) {
    call->wire_ = std::move(core_->spare_wires.back());
    core_->spare_wires.pop_back();
  }
  if (Status s = detail::build_wire(call->key_, request, &call->wire_); !s) {
    core_->fail_later(call, UpstreamFailure::kBadRequest, std::move(s));
    return call;
  }
  core_->launch(call, /*allow_reuse=*/true);
  return call;
}

void UpstreamPool::close_all() { core_->close_all(); }

PoolStats UpstreamPool::stats() const {
  PoolStats stats = core_->stats;
  stats.name_lookups = core_->resolver->stats().lookups;
  return stats;
}

}  // namespace pdr::http
