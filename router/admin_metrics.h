// The admin API's /metrics family, written by the component that counts it (as the proxy's are,
// router/proxy/proxy_counters.h); proto/base/metrics_writer.h provides the writer.
#pragma once

#include "router/admin_routes.h"
#include "proto/base/metrics_writer.h"

namespace pdr::router {

// pdrouter_admin_requests_total{result="ok|unauthorized|disabled|bad_request|not_found|conflict|unavailable|throttled"}
// pdrouter_admin_auth_throttled_total
void write_admin_metrics(MetricsWriter& out, const AdminCounters& counters);

}  // namespace pdr::router
