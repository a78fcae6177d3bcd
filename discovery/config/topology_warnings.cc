#include "discovery/config/topology_warnings.h"

#include <string>

namespace pdr::config {

std::vector<std::string> topology_warnings(const Topology& topology) {
  std::vector<std::string> out;
  if (topology.policies.cache_aware.tokenize_by_node && !topology.kv_events.enabled) {
    out.push_back(
        "policies.cache_aware.tokenize is node but kv_events.enabled is false: the token ids are "
        "matched on the KV events' block index, which stays empty, so tokenize does nothing; "
        "enable kv_events or set tokenize: off");
  }
  const Topology::Kubernetes& k8s = topology.kubernetes;
  if (k8s.enabled && !k8s.api_server_tls && !k8s.token_file.empty()) {
    out.push_back(
        "kubernetes.api_server is " + k8s.api_server_url + " (http://) and kubernetes.token_file is '" +
        k8s.token_file +
        "': the token (by default the pod's service-account token) is sent in clear on every call to the "
        "API server; use https:// (with kubernetes.ca_file), or token_file: \"\" when a local kubectl proxy "
        "adds the credentials");
  }
  // The admin throttle lets a right key in even while its source is throttled
  // (router/clients/admin_throttle.h), so guessing is bounded by the key's length, not by the throttle.
  if (!topology.admin.api_key.empty() && topology.admin.api_key.size() < 16) {
    out.push_back("admin.api_key is " + std::to_string(topology.admin.api_key.size()) +
                  " characters long: a short admin key can be guessed; use a random one of at least 16 "
                  "characters (e.g. openssl rand -hex 16)");
  }
  if (topology.client_auth.enabled() && topology.client_auth.keys.keys.empty()) {
    out.push_back("client_auth.keys_file '" + topology.client_auth.keys_file +
                  "' holds no key: every client request is refused (401) until keys are added");
  }
  if (topology.client_auth.enabled() && !topology.tenants.header.empty()) {
    out.push_back("tenants.header is ignored while client_auth.keys_file is set: a request's tenant is its key's");
  }
  if (topology.client_auth.forward_client_key && !topology.connectors.upstream_api_key.empty()) {
    out.push_back("client_auth.forward_client_key has no effect: connectors.upstream_api_key replaces the client's "
                  "credential on every leg");
  }
  return out;
}

}  // namespace pdr::config
