#include "discovery/sidecar/health_probe.h"

#include <llhttp.h>

#include "transfer/net/blocking_socket.h"

namespace pdr::sidecar {
namespace {

struct ParseState {
  bool complete = false;
};

int on_message_complete(llhttp_t* parser) {
  static_cast<ParseState*>(parser->data)->complete = true;
  // Stop parsing here: anything after the first response is not ours to read.
  return HPE_PAUSED;
}

// Reads and parses until the response is complete, the peer closes, or the deadline passes.
HealthProbeResult read_response(int fd, SocketClock::time_point deadline) {
  llhttp_settings_t settings;
  llhttp_settings_init(&settings);
  settings.on_message_complete = on_message_complete;
  llhttp_t parser;
  llhttp_init(&parser, HTTP_RESPONSE, &settings);
  ParseState state;
  parser.data = &state;

  HealthProbeResult result;
  char buffer[4096];
  while (!state.complete) {
    size_t n = 0;
    if (Status s = recv_some(fd, buffer, sizeof(buffer), deadline, &n); !s) {
      result.error = s.message();
      return result;
    }
    llhttp_errno_t rc = n == 0 ? llhttp_finish(&parser) : llhttp_execute(&parser, buffer, n);
    if (rc != HPE_OK && rc != HPE_PAUSED) {
      result.error = std::string("bad HTTP response: ") + llhttp_errno_name(rc) + " " +
                     (llhttp_get_error_reason(&parser) ? llhttp_get_error_reason(&parser) : "");
      return result;
    }
    if (n == 0 && !state.complete) {
      result.error = "connection closed before the response was complete";
      return result;
    }
  }
  result.status_code = parser.status_code;
  return result;
}

}  // namespace

std::string HealthProbeResult::describe() const {
  if (!error.empty()) return error;
  return "HTTP " + std::to_string(status_code);
}

Status HealthProbe::from_url(std::string_view url, std::chrono::milliseconds timeout,
                             HealthProbe* out) {
  proto::HttpUrl parsed;
  if (Status s = proto::parse_http_url(url, &parsed); !s.is_ok()) return s;
  if (timeout.count() <= 0) return Status(StatusCode::kOutOfRange, "health timeout must be positive");
  *out = HealthProbe(parsed.address, parsed.path.empty() ? "/health" : parsed.path, timeout);
  return Status::ok();
}

HealthProbeResult HealthProbe::probe() const {
  const SocketClock::time_point deadline = SocketClock::now() + timeout_;
  HealthProbeResult result;
  UniqueFd fd;
  if (Status s = connect_tcp(address_.host, address_.port, deadline, &fd); !s) {
    result.error = s.message();
    return result;
  }
  const std::string request = "GET " + path_ + " HTTP/1.1\r\nHost: " + address_.to_string() +
                              "\r\nUser-Agent: pdnode\r\nAccept: */*\r\nConnection: close\r\n\r\n";
  if (Status s = send_all(fd.get(), request, deadline); !s) {
    result.error = s.message();
    return result;
  }
  return read_response(fd.get(), deadline);
}

}  // namespace pdr::sidecar
