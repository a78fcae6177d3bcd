// GET /metrics: pdrouter_upstream_tls_errors_total{reason}, the TLS failures of every upstream
// client that speaks TLS (etcd over https, the Kubernetes API, nodes with connectors.tls;
// router/http/tls_client.h). docs/metrics.md
// lists it.
#pragma once

#include "proto/base/metrics_writer.h"

namespace pdr::router {

// Every reason is written, at 0 too, so dashboards see the same series with or without TLS.
void write_upstream_tls_metrics(MetricsWriter& out);

}  // namespace pdr::router
