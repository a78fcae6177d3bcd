// The topology sections about TLS and tracing (listeners.tls, listeners.admin_tls, connectors.tls,
// an instance's tls, tracing): read from YAML into discovery/config/topology.h's structs. Internal to the
// topology loader (yaml-cpp types inside).
#pragma once

#include "discovery/config/topology.h"
#include "discovery/config/yaml_reader.h"

namespace pdr::config {

// listeners.tls / listeners.admin_tls: {cert_file, key_file, client_ca_file}; cert_file and
// key_file together.
Status read_listener_tls(const yaml::Source& src, const yaml::Field& f, ListenerTls* out);

// connectors.tls and an instance's tls: {enabled, ca_file, cert_file, key_file, server_name}.
// Reads over *out, so an instance starts from the section's settings and replaces what it names;
// a map present turns TLS on unless it says enabled: false.
Status read_node_tls(const yaml::Source& src, const yaml::Field& f, NodeTls* out);

// tracing: {endpoint, sampling_ratio, service_name, max_queue_spans, batch_ms, max_batch_spans,
// export_timeout_ms}.
Status read_tracing(const yaml::Source& src, const yaml::Field& f, Topology::Tracing* out);

}  // namespace pdr::config
