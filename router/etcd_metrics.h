// GET /metrics: the pdrouter_etcd_* families of the shared registry (registry.backend: etcd,
// discovery/sources/etcd/registry_replicator.h). docs/metrics.md lists them.
#pragma once

#include "proto/base/metrics_writer.h"
#include "discovery/sources/etcd/registry_replicator.h"

namespace pdr::router {

// `replicator` null (registry.backend: memory): every family at 0, so dashboards and alerts see
// the same names either way.
void write_etcd_metrics(MetricsWriter& out, const discovery::sources::etcd::RegistryReplicator* replicator);

}  // namespace pdr::router
