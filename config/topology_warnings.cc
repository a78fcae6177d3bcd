#include "config/topology_warnings.h"

namespace pdr::config {

std::vector<std::string> topology_warnings(const Topology& topology) {
  std::vector<std::string> out;
  if (topology.policies.cache_aware.tokenize_by_node && !topology.kv_events.enabled) {
    out.push_back(
        "policies.cache_aware.tokenize is node but kv_events.enabled is false: the token ids are "
        "matched on the KV events' block index, which stays empty, so tokenize does nothing; "
        "enable kv_events or set tokenize: off");
  }
  return out;
}

}  // namespace pdr::config
