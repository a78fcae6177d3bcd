// Blocking HTTP/1.1 client for tests. Every call is bounded by a timeout (poll()) and reports
// failure through an error string, never an exception, so a misbehaving server fails one
// assertion instead of hanging the test.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pdr::test {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpResponse {
  std::string error;  // empty on success
  int status = 0;
  int http_major = 0;
  int http_minor = 0;
  HeaderList headers;
  std::string body;                  // de-chunked
  bool chunked = false;              // Transfer-Encoding: chunked
  std::vector<std::string> chunks;   // chunk payloads as framed by the server (chunked only)
  bool keep_alive = false;           // the server allows another request on this connection

  bool ok() const { return error.empty(); }
  // First header with this name (case-insensitive).
  std::optional<std::string> header(std::string_view name) const;
};

struct ReadResult {
  std::string data;      // every byte received (including any left over from earlier reads)
  std::string error;     // "timeout", or a socket error; empty if the peer closed
  bool closed = false;   // EOF or reset seen
  std::chrono::milliseconds elapsed{0};
};

class HttpClient {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{5000};

  HttpClient() = default;
  ~HttpClient();
  HttpClient(HttpClient&& other) noexcept;
  HttpClient& operator=(HttpClient&& other) noexcept;
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Returns "" on success, else the reason ("connect to 127.0.0.1:80: Connection refused",
  // "connect to ...: timed out"; transfer/net/blocking_socket.h).
  std::string connect(const std::string& host, uint16_t port,
                      std::chrono::milliseconds timeout = kDefaultTimeout);
  bool connected() const { return fd_ >= 0; }
  void close();
  void shutdown_write();

  // Sends bytes as given. Returns "" on success.
  std::string send_raw(std::string_view bytes, std::chrono::milliseconds timeout = kDefaultTimeout);
  // Sends a request; adds Host and (for a body, unless the headers set framing) Content-Length.
  std::string send_request(std::string_view method, std::string_view target,
                           const HeaderList& headers = {}, std::string_view body = {},
                           std::chrono::milliseconds timeout = kDefaultTimeout);
  // Reads exactly one response (a 1xx interim response counts as one). Bytes after it stay
  // buffered for the next call, so pipelined responses can be read one by one.
  // `head_request`: the response to a HEAD request has no body whatever its headers say.
  HttpResponse read_response(std::chrono::milliseconds timeout = kDefaultTimeout,
                             bool head_request = false);
  // send_request + read_response.
  HttpResponse request(std::string_view method, std::string_view target,
                       const HeaderList& headers = {}, std::string_view body = {},
                       std::chrono::milliseconds timeout = kDefaultTimeout);
  // Reads until the peer closes or the timeout expires.
  ReadResult read_until_closed(std::chrono::milliseconds timeout = kDefaultTimeout);

  static std::string build_request(std::string_view method, std::string_view target,
                                   const HeaderList& headers, std::string_view body);

 private:
  // Appends received bytes to pending_. Returns 1 on data, 0 on EOF, -1 on error/timeout.
  int receive(std::chrono::steady_clock::time_point deadline, std::string* error);

  int fd_ = -1;
  std::string host_;
  std::string pending_;  // received, not yet consumed
};

// One-shot helper: connect, send one request, read the response, close.
HttpResponse http_request(const std::string& host, uint16_t port, std::string_view method,
                          std::string_view target, const HeaderList& headers = {},
                          std::string_view body = {},
                          std::chrono::milliseconds timeout = HttpClient::kDefaultTimeout);

}  // namespace pdr::test
