#include "tests/support/http_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <llhttp.h>

#include "proto/base/ascii.h"
#include "transfer/net/blocking_socket.h"

namespace pdr::test {

namespace {

using Clock = std::chrono::steady_clock;


int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Parser state for one response.
struct ResponseParse {
  HttpResponse* out = nullptr;
  bool in_value = false;
  bool done = false;
  bool head_request = false;
};

int cb_header_field(llhttp_t* p, const char* at, size_t len) {
  auto* s = static_cast<ResponseParse*>(p->data);
  if (s->in_value || s->out->headers.empty()) {
    s->out->headers.emplace_back();
    s->in_value = false;
  }
  s->out->headers.back().first.append(at, len);
  return 0;
}

int cb_header_value(llhttp_t* p, const char* at, size_t len) {
  auto* s = static_cast<ResponseParse*>(p->data);
  s->in_value = true;
  if (s->out->headers.empty()) s->out->headers.emplace_back();
  s->out->headers.back().second.append(at, len);
  return 0;
}

int cb_headers_complete(llhttp_t* p) {
  auto* s = static_cast<ResponseParse*>(p->data);
  s->out->status = p->status_code;
  s->out->http_major = p->http_major;
  s->out->http_minor = p->http_minor;
  s->out->chunked = (p->flags & F_CHUNKED) != 0;
  s->out->keep_alive = llhttp_should_keep_alive(p) != 0;
  return s->head_request ? 1 : 0;
}

int cb_chunk_header(llhttp_t* p) {
  auto* s = static_cast<ResponseParse*>(p->data);
  if (p->content_length > 0) s->out->chunks.emplace_back();
  return 0;
}

int cb_body(llhttp_t* p, const char* at, size_t len) {
  auto* s = static_cast<ResponseParse*>(p->data);
  s->out->body.append(at, len);
  if (s->out->chunked && !s->out->chunks.empty()) s->out->chunks.back().append(at, len);
  return 0;
}

int cb_message_complete(llhttp_t* p) {
  auto* s = static_cast<ResponseParse*>(p->data);
  s->done = true;
  s->out->keep_alive = llhttp_should_keep_alive(p) != 0;
  return HPE_PAUSED;
}

const llhttp_settings_t* response_settings() {
  static const llhttp_settings_t settings = [] {
    llhttp_settings_t s;
    llhttp_settings_init(&s);
    s.on_header_field = cb_header_field;
    s.on_header_value = cb_header_value;
    s.on_headers_complete = cb_headers_complete;
    s.on_chunk_header = cb_chunk_header;
    s.on_body = cb_body;
    s.on_message_complete = cb_message_complete;
    return s;
  }();
  return &settings;
}

}  // namespace

std::optional<std::string> HttpResponse::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return std::nullopt;
}

HttpClient::~HttpClient() { close(); }

HttpClient::HttpClient(HttpClient&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), host_(std::move(other.host_)), pending_(std::move(other.pending_)) {}

HttpClient& HttpClient::operator=(HttpClient&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    host_ = std::move(other.host_);
    pending_ = std::move(other.pending_);
  }
  return *this;
}

void HttpClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  pending_.clear();
}

void HttpClient::shutdown_write() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

std::string HttpClient::connect(const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  close();
  UniqueFd fd;
  if (Status s = connect_tcp(host, port, Clock::now() + timeout, &fd); !s) return s.message();
  fd_ = fd.release();
  host_ = host;
  return "";
}

std::string HttpClient::send_raw(std::string_view bytes, std::chrono::milliseconds timeout) {
  if (fd_ < 0) return "not connected";
  if (Status s = send_all(fd_, bytes, Clock::now() + timeout); !s) return s.message();
  return "";
}

std::string HttpClient::build_request(std::string_view method, std::string_view target,
                                      const HeaderList& headers, std::string_view body) {
  bool has_host = false, has_framing = false;
  for (const auto& [k, v] : headers) {
    if (iequals(k, "host")) has_host = true;
    if (iequals(k, "content-length") || iequals(k, "transfer-encoding")) has_framing = true;
  }
  std::string out;
  out.append(method).append(" ").append(target).append(" HTTP/1.1\r\n");
  if (!has_host) out += "Host: test\r\n";
  for (const auto& [k, v] : headers) out.append(k).append(": ").append(v).append("\r\n");
  if (!has_framing && (!body.empty() || method == "POST" || method == "PUT")) {
    out.append("Content-Length: ").append(std::to_string(body.size())).append("\r\n");
  }
  out += "\r\n";
  out.append(body);
  return out;
}

std::string HttpClient::send_request(std::string_view method, std::string_view target,
                                     const HeaderList& headers, std::string_view body,
                                     std::chrono::milliseconds timeout) {
  return send_raw(build_request(method, target, headers, body), timeout);
}

int HttpClient::receive(Clock::time_point deadline, std::string* error) {
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n > 0) {
      pending_.append(buf, static_cast<size_t>(n));
      return 1;
    }
    if (n == 0) return 0;
    if (errno == ECONNRESET) return 0;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      *error = errno_text("recv");
      return -1;
    }
    pollfd pfd{fd_, POLLIN, 0};
    const int rc = ::poll(&pfd, 1, remaining_ms(deadline));
    if (rc == 0) {
      *error = "timeout";
      return -1;
    }
    if (rc < 0 && errno != EINTR) {
      *error = errno_text("poll");
      return -1;
    }
  }
}

HttpResponse HttpClient::read_response(std::chrono::milliseconds timeout, bool head_request) {
  HttpResponse out;
  if (fd_ < 0) {
    out.error = "not connected";
    return out;
  }
  const auto deadline = Clock::now() + timeout;
  ResponseParse state;
  state.out = &out;
  state.head_request = head_request;
  llhttp_t parser;
  llhttp_init(&parser, HTTP_RESPONSE, response_settings());
  parser.data = &state;
  for (;;) {
    if (!pending_.empty()) {
      const llhttp_errno_t err = llhttp_execute(&parser, pending_.data(), pending_.size());
      if (err == HPE_PAUSED || err == HPE_PAUSED_UPGRADE) {
        pending_.erase(0, static_cast<size_t>(llhttp_get_error_pos(&parser) - pending_.data()));
      } else if (err != HPE_OK) {
        out.error = std::string("parse error ") + llhttp_errno_name(err) + ": " +
                    llhttp_get_error_reason(&parser);
        return out;
      } else {
        pending_.clear();
      }
      if (state.done) return out;
    }
    std::string error;
    const int rc = receive(deadline, &error);
    if (rc < 0) {
      out.error = error;
      return out;
    }
    if (rc == 0) {
      // EOF: completes a close-delimited body, anything else is truncation.
      if (llhttp_finish(&parser) == HPE_OK && state.done) return out;
      if (state.done) return out;
      out.error = "connection closed before the response was complete";
      return out;
    }
  }
}

HttpResponse HttpClient::request(std::string_view method, std::string_view target,
                                 const HeaderList& headers, std::string_view body,
                                 std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string err = send_request(method, target, headers, body, timeout);
  if (!err.empty()) {
    HttpResponse r;
    r.error = err;
    return r;
  }
  return read_response(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()),
                       method == "HEAD");
}

ReadResult HttpClient::read_until_closed(std::chrono::milliseconds timeout) {
  ReadResult r;
  const auto start = Clock::now();
  if (fd_ < 0) {
    r.error = "not connected";
    return r;
  }
  const auto deadline = start + timeout;
  for (;;) {
    std::string error;
    const int rc = receive(deadline, &error);
    if (rc == 0) {
      r.closed = true;
      break;
    }
    if (rc < 0) {
      r.error = error;
      break;
    }
  }
  r.data = std::move(pending_);
  pending_.clear();
  r.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  return r;
}

HttpResponse http_request(const std::string& host, uint16_t port, std::string_view method,
                          std::string_view target, const HeaderList& headers, std::string_view body,
                          std::chrono::milliseconds timeout) {
  HttpClient c;
  if (std::string err = c.connect(host, port, timeout); !err.empty()) {
    HttpResponse r;
    r.error = err;
    return r;
  }
  return c.request(method, target, headers, body, timeout);
}

}  // namespace pdr::test
