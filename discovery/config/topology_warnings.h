// Settings a topology accepts but that cannot do what they say with the rest of the file: the
// file is valid (nothing is refused), so these are warnings, logged by load_topology_file on
// start-up and on every reload (pdr::log::warn, one line each, prefixed with the file name).
//
//   policies.cache_aware.tokenize: node without kv_events.enabled: the token ids a node's
//   /tokenize returns are matched on the KV events' block index, which is empty without KV
//   events, so the extra hop buys nothing.
//
//   kubernetes.enabled with an http:// api_server and a token_file: the bearer token (by
//   default the service account's) travels in clear on every list and watch.
//
//   client_auth.keys_file with no key (every client request is refused), tenants.header with
//   client keys (ignored: the key names the tenant), client_auth.forward_client_key with
//   connectors.upstream_api_key (the router's key replaces the client's anyway).
#pragma once

#include <string>
#include <vector>

#include "discovery/config/topology.h"

namespace pdr::config {

// One message per setting above that applies to `topology`, naming the keys; empty if none.
std::vector<std::string> topology_warnings(const Topology& topology);

}  // namespace pdr::config
