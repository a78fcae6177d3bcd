#include "router/routing/node_calls.h"

namespace pdr::router::routing {

std::string upstream_authorization(const config::Topology& topology, std::string_view client_value) {
  if (!client_value.empty()) return std::string(client_value);
  if (!topology.connectors.upstream_api_key.empty()) return "Bearer " + topology.connectors.upstream_api_key;
  return {};
}

}  // namespace pdr::router::routing
