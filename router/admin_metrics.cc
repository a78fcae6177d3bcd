#include "router/admin_metrics.h"

namespace pdr::router {

void write_admin_metrics(MetricsWriter& out, const AdminCounters& c) {
  for (size_t r = 0; r < AdminCounters::kResultCount; ++r) {
    out.counter("pdrouter_admin_requests_total", "Admin API requests by result",
                static_cast<double>(c.by_result[r].load(std::memory_order_relaxed)),
                {{"result", std::string(AdminCounters::label(static_cast<AdminCounters::Result>(r)))}});
  }
  out.counter("pdrouter_admin_auth_throttled_total",
              "Admin requests refused with 429 because their address failed authentication too often",
              static_cast<double>(c.auth_throttled.load(std::memory_order_relaxed)));
}

}  // namespace pdr::router
