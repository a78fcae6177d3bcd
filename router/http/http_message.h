// Plain HTTP/1.1 message types shared by the server, handlers and (later) the upstream client.
//
// No libuv or llhttp types here: handlers and policies include this header freely.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/ascii.h"
#include "router/http/body_budget.h"

namespace pdr::http {

struct Header {
  std::string name;
  std::string value;
};

// Header names compare ASCII case-insensitively.
using pdr::iequals;

// One parsed request, owned by the handler once dispatched.
struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // request-target exactly as received ("/v1/completions?x=1")
  std::string path;    // target up to '?'
  std::string query;   // after '?', without it; empty if none
  std::vector<Header> headers;  // in arrival order, names as sent
  std::string body;             // de-chunked
  // The body's share of ServerOptions::body_budget (empty without one): see body_budget.h.
  BodyCharge body_charge;
  bool keep_alive = true;       // the client allows another request on this connection
  uint8_t http_major = 1;
  uint8_t http_minor = 1;
  std::string peer;             // "127.0.0.1:53412" or "[::1]:53412"
  uint32_t worker = 0;          // index of the worker (thread, loop) running the handler
  // When the request head was parsed (steady clock): where latency histograms start.
  std::chrono::steady_clock::time_point head_at{};

  // First header with this name (case-insensitive). The view points into `headers`.
  std::optional<std::string_view> header(std::string_view name) const;
};

// A complete (non-streamed) response. The server owns framing: Content-Length,
// Transfer-Encoding, Connection and Keep-Alive given here are dropped and written by the server.
struct Response {
  int status = 200;
  std::vector<Header> headers;
  std::string body;

  static Response json(int status, std::string body);
  static Response text(int status, std::string body,
                       std::string_view content_type = "text/plain; charset=utf-8");
};

// "OK", "Not Found", ...; "Unknown" for codes without a registered phrase.
std::string_view reason_phrase(int status);

// True for headers the server writes itself (framing and hop-by-hop connection management).
bool is_server_managed_header(std::string_view name);

// True if `s` holds CR, LF or NUL: such a header name or value would split or end the header
// block it is written into, so it is never written. (One pass; string_view::find_first_of with a
// 3-character set calls memchr once per character.)
inline bool has_crlf_or_nul(std::string_view s) {
  for (const char c : s) {
    if (c == '\r' || c == '\n' || c == '\0') return true;
  }
  return false;
}

}  // namespace pdr::http
