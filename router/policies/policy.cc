#include "router/policies/policy.h"

#include "router/policies/predicted_latency.h"

namespace pdr::router {

std::unique_ptr<Policy> make_policy(config::PolicyName name, uint64_t seed,
                                    const config::Topology::Policies& config, PolicyLeg leg) {
  switch (name) {
    case config::PolicyName::kRoundRobin:
      return make_round_robin_policy();
    case config::PolicyName::kLeastOutstanding:
      return make_least_outstanding_policy();
    case config::PolicyName::kPowerOfTwo:
      return make_power_of_two_policy(seed);
    case config::PolicyName::kAffinity:
      return make_affinity_policy();
    case config::PolicyName::kCacheAware:
      return make_cache_aware_policy(config.cache_aware);
    case config::PolicyName::kPredictedLatency:
      return make_predicted_latency_policy(config.predicted_latency, leg);
  }
  // Out-of-range enum value: the topology loader never produces one. Round-robin is always safe.
  return make_round_robin_policy();
}

}  // namespace pdr::router
