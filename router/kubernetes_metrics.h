// GET /metrics: the pdrouter_kubernetes_* families of Kubernetes pod discovery
// (discovery/sources/kubernetes/pod_watcher.h). docs/metrics.md lists them.
#pragma once

#include "proto/base/metrics_writer.h"
#include "discovery/sources/kubernetes/pod_watcher.h"

namespace pdr::router {

// `watcher` null (kubernetes.enabled false): every family at 0.
void write_kubernetes_metrics(MetricsWriter& out, const discovery::sources::kubernetes::PodWatcher* watcher);

}  // namespace pdr::router
