#include "router/routing/cache_routing.h"
#include "router/proxy/proxy_shared.h"

#include <random>

namespace pdr::router::proxy {

std::shared_ptr<PolicySet> ProxyShared::policies_for(const config::Topology& topology) {
  std::lock_guard<std::mutex> lock(policies_mutex_);
  if (!policies_ || prefill_name_ != topology.policies.prefill || decode_name_ != topology.policies.decode ||
      cache_aware_ != topology.policies.cache_aware || predicted_latency_ != topology.policies.predicted_latency) {
    auto set = std::make_shared<PolicySet>();
    std::random_device rd;
    set->prefill = make_policy(topology.policies.prefill, (uint64_t{rd()} << 32) ^ rd(), topology.policies, PolicyLeg::kPrefill);
    set->decode = make_policy(topology.policies.decode, (uint64_t{rd()} << 32) ^ rd(), topology.policies, PolicyLeg::kDecode);
    policies_ = std::move(set);
    prefill_name_ = topology.policies.prefill;
    decode_name_ = topology.policies.decode;
    cache_aware_ = topology.policies.cache_aware;
    predicted_latency_ = topology.policies.predicted_latency;
  }
  return policies_;
}

WorkerContext::WorkerContext(ProxyShared& shared, uint32_t index, uv_loop_s* loop, UpstreamPort* upstream)
    : shared_(shared),
      index_(index),
      loop_(loop),
      timers_(loop),
      pool_(loop),
      upstream_(upstream != nullptr ? upstream : &pool_port_),
      mooncake_(*upstream_),
      registry_(*shared.registry),
      topology_(*shared.topology),
      node_tls_(shared.node_tls),
      self_tls_(shared.self_tls) {
  std::random_device rd;
  rng_state_ = (uint64_t{rd()} << 32) ^ rd() ^ (uint64_t{index} << 56);
}

WorkerContext::~WorkerContext() {
  if (upstream_ != &pool_port_) upstream_->close_all();
  pool_.close_all();
}

void ProxyShared::forget_departed_nodes(const std::shared_ptr<const discovery::RegistrySnapshot>& now) {
  if (!now) return;
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(departures_mutex_);
    // Snapshots change on registration events, not per request: the mutex is not contended.
    if (departures_seen_ == now || (departures_seen_ && now->version < departures_seen_->version)) return;
    if (departures_seen_ && prefix_tree != nullptr) {
      proxy::forget_departed_nodes(departures_seen_->instances, now->instances, *prefix_tree);
    }
    changed = departures_seen_ != nullptr;
    departures_seen_ = now;
  }
  // The predictions of a waiting request may be met now (a new node, one back from a drain).
  if (changed && slo_gate.parked() > 0) slo_gate.wake();
}

void WorkerContext::on_new_registry(const std::shared_ptr<const discovery::RegistrySnapshot>& now) {
  shared_.forget_departed_nodes(now);
  seen_registry_ = now;
}

PolicySet& WorkerContext::policies() {
  const auto& topology = this->topology();
  if (topology != policies_topology_ || !policies_) {
    policies_ = shared_.policies_for(*topology);
    policies_topology_ = topology;
  }
  return *policies_;
}

const clients::TenantTable& WorkerContext::tenants() {
  const auto& topology = this->topology();
  if (topology != tenants_topology_ || !tenants_) {
    tenants_ = shared_.gate.tenants().table_for(topology);
    tenants_topology_ = topology;
  }
  return *tenants_;
}

uint64_t WorkerContext::random() {
  uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace pdr::router::proxy
