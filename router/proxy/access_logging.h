// The access log (router/clients/access_log.h) from the client API's side: a request's record as
// ProxyService knows it when the request arrives, completed by whoever answers it: the P/D
// session (proxy_session.h, hand_over_record), or log_answered() for a request answered without
// one (refused by the key check, a tenant limit or admission; a one-node relay when it ends).
// Nothing is built while the log is off. Worker threads.
#pragma once

#include <memory>
#include <string_view>

#include "router/http/http_message.h"
#include "router/clients/access_record.h"
#include "router/proxy/proxy_shared.h"

namespace pdr::router::proxy {

// The record of `request` for tenant `tenant` ("" = not known), with what its arrival tells:
// client address, method, path, trace id (its traceparent), body bytes. Null while the log is off.
std::unique_ptr<clients::AccessRecord> start_record(const ProxyShared& shared, const http::Request& request,
                                                    std::string_view tenant);

// Completes `record` (null: nothing) with its end: now, `status`, `outcome` (a literal),
// `bytes_out` answer body bytes, the time since `arrived_at`; and logs it.
void log_answered(ProxyShared& shared, std::unique_ptr<clients::AccessRecord> record,
                  std::chrono::steady_clock::time_point arrived_at, int status, std::string_view outcome,
                  uint64_t bytes_out);

// The two above at once, for a request answered at once (refused before any work).
void log_refused(ProxyShared& shared, const http::Request& request, std::string_view tenant, int status,
                 uint64_t bytes_out);

}  // namespace pdr::router::proxy
