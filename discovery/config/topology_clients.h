// The topology's client sections, YAML -> Topology (called by topology_loader.cc):
//   client_auth:  keys_file (read and parsed here: client_key_file.h), forward_client_key
//   tenants:      header, defaults {requests_per_second, burst, tokens_per_minute, max_in_flight,
//                 priority},
//                 limits {<tenant>: {the same keys}}
//   access_log:   path, max_queued_lines
// Errors as every topology error: "FILE:LINE:COL: key.path: what".
#pragma once

#include "discovery/config/topology.h"
#include "discovery/config/yaml_reader.h"

namespace pdr::config {

Status read_client_auth(const yaml::Source& src, const yaml::Field& f, Topology::ClientAuth* out);
Status read_tenants(const yaml::Source& src, const yaml::Field& f, Topology::Tenants* out);
Status read_access_log(const yaml::Source& src, const yaml::Field& f, Topology::AccessLog* out);

}  // namespace pdr::config
