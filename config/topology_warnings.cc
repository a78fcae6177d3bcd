#include "config/topology_warnings.h"

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
  // (router/admin_throttle.h), so guessing is bounded by the key's length, not by the throttle.
  if (!topology.admin.api_key.empty() && topology.admin.api_key.size() < 16) {
    out.push_back("admin.api_key is " + std::to_string(topology.admin.api_key.size()) +
                  " characters long: a short admin key can be guessed; use a random one of at least 16 "
                  "characters (e.g. openssl rand -hex 16)");
  }
  return out;
}

}  // namespace pdr::config
