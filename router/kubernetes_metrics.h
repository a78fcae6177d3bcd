// GET /metrics: the pdrouter_kubernetes_* families of Kubernetes pod discovery
// (router/k8s/pod_watcher.h). docs/metrics.md lists them.
#pragma once

#include "base/metrics_writer.h"
#include "router/k8s/pod_watcher.h"

namespace pdr::router {

// `watcher` null (kubernetes.enabled false): every family at 0.
void write_kubernetes_metrics(MetricsWriter& out, const PodWatcher* watcher);

}  // namespace pdr::router
