#include "router/upstream_tls_metrics.h"

#include "router/http/tls_client.h"

namespace pdr::router {

void write_upstream_tls_metrics(MetricsWriter& out) {
  for (size_t i = 0; i < static_cast<size_t>(http::TlsErrorReason::kCount); ++i) {
    const auto reason = static_cast<http::TlsErrorReason>(i);
    out.counter("pdrouter_upstream_tls_errors_total",
                "TLS failures talking to upstreams over TLS (etcd over https, the Kubernetes API, nodes with "
                "connectors.tls), by reason: verify (certificate not trusted, expired or for another name), "
                "handshake, protocol",
                static_cast<double>(http::tls_error_count(reason)), {{"reason", http::tls_error_reason_name(reason)}});
  }
}

}  // namespace pdr::router
