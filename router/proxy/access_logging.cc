// Access log records of the client API (contracts in access_logging.h).
#include "router/proxy/access_logging.h"

#include "router/clients/access_log.h"
#include "router/clients/admin_throttle.h"

namespace pdr::router::proxy {

std::unique_ptr<clients::AccessRecord> start_record(const ProxyShared& shared, const http::Request& request,
                                                    std::string_view tenant) {
  if (shared.access_log == nullptr || !shared.access_log->enabled()) return nullptr;
  auto r = std::make_unique<clients::AccessRecord>();
  r->client = clients::AdminThrottle::address_of(request.peer);
  r->tenant = tenant;
  r->method = request.method;
  r->path = request.path;
  if (auto traceparent = request.header("traceparent")) r->trace_id = clients::trace_id_of(*traceparent);
  r->bytes_in = request.body.size();
  return r;
}

void log_answered(ProxyShared& shared, std::unique_ptr<clients::AccessRecord> record,
                  std::chrono::steady_clock::time_point arrived_at, int status, std::string_view outcome,
                  uint64_t bytes_out) {
  if (!record || shared.access_log == nullptr) return;
  record->time = std::chrono::system_clock::now();
  record->status = status;
  record->outcome = outcome;
  record->bytes_out = bytes_out;
  if (arrived_at != std::chrono::steady_clock::time_point{}) {
    record->total_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - arrived_at).count();
  }
  shared.access_log->log(std::move(*record));
}

void log_refused(ProxyShared& shared, const http::Request& request, std::string_view tenant, int status,
                 uint64_t bytes_out) {
  log_answered(shared, start_record(shared, request, tenant), request.head_at, status, "refused", bytes_out);
}

}  // namespace pdr::router::proxy
