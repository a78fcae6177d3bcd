// HealthProbe: one blocking HTTP/1.1 GET of a node's health endpoint (vLLM answers GET /health with
// 200 and an empty body when its engine is alive), bounded by a total deadline that covers
// connect, send and read. The response is parsed with llhttp; nothing throws.
//
// Threads: a HealthProbe is immutable after construction; probe() may be called from any thread,
// concurrently. Name resolution (getaddrinfo) happens per probe and is not covered by the deadline;
// use IP literals where that matters.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "proto/address.h"
#include "proto/base/status.h"

namespace pdr::sidecar {

struct HealthProbeResult {
  int status_code = 0;  // HTTP status when a complete response head was read, else 0
  std::string error;    // empty on a complete exchange; otherwise what went wrong

  // Healthy means: a complete response with status 200.
  bool healthy() const { return error.empty() && status_code == 200; }
  // "200", "503" or the error text, for logs.
  std::string describe() const;
};

class HealthProbe {
 public:
  HealthProbe() = default;
  HealthProbe(proto::HostPort address, std::string path, std::chrono::milliseconds timeout)
      : address_(std::move(address)), path_(std::move(path)), timeout_(timeout) {}

  // Parses "http://host:port/path" (scheme http only; an empty path becomes "/health").
  static Status from_url(std::string_view url, std::chrono::milliseconds timeout, HealthProbe* out);

  // Connects, sends "GET <path>", reads the response until its end (or the peer closes) and
  // returns its status code, or an error once the deadline (timeout from the call) passes.
  HealthProbeResult probe() const;

  const proto::HostPort& address() const { return address_; }
  const std::string& path() const { return path_; }
  std::string url() const { return "http://" + address_.to_string() + path_; }

 private:
  proto::HostPort address_;
  std::string path_ = "/health";
  std::chrono::milliseconds timeout_{1000};
};

}  // namespace pdr::sidecar
