// One blocking HTTP/1.1 POST to an OTLP/HTTP collector, for the span exporter's own thread
// (span_exporter.h): connect, send, read the answer, all within one deadline (poll(2) on a
// non-blocking socket), on a fresh connection each time (an export leaves every batch_ms at
// most: a pooled connection would save little and could be found closed).
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "proto/base/status.h"
#include "proto/address.h"

namespace pdr::router::tracing {

// The answer's status code in *status (any code: the caller decides), or kIoError ("connect to
// host:port: ...", "... timed out after N ms") / kMalformed (not an HTTP answer). Host names are
// resolved with getaddrinfo (on the calling thread). `cancel_fd` (>= 0): a descriptor that becomes
// readable to give up at once ("... export cancelled"), so that a stopping process does not wait for a slow
// collector.
Status otlp_http_post(const proto::HostPort& collector, std::string_view path, std::string_view content_type,
                      std::string_view body, std::chrono::milliseconds timeout, int* status, int cancel_fd = -1);

}  // namespace pdr::router::tracing
