#include "discovery/instance.h"

#include <algorithm>

namespace pdr::discovery {

std::string_view to_string(InstanceState state) {
  switch (state) {
    case InstanceState::kUp: return "up";
    case InstanceState::kDraining: return "draining";
    case InstanceState::kExpired: return "expired";
  }
  return "unknown";
}

std::string_view to_string(InstanceSource source) {
  switch (source) {
    case InstanceSource::kRegistered: return "registered";
    case InstanceSource::kStatic: return "static";
    case InstanceSource::kAdmin: return "admin";
    case InstanceSource::kReplica: return "replica";
    case InstanceSource::kKubernetes: return "kubernetes";
  }
  return "unknown";
}

std::string_view to_string(const ReplicaOrigin& origin) {
  return origin.operator_entry ? std::string_view("operator") : config::to_string(origin.admission);
}

ReplicaOrigin parse_replica_origin(std::string_view name) {
  ReplicaOrigin origin;
  if (name == "operator") {
    origin.operator_entry = true;
  } else if (!config::parse_admission_class(name, &origin.admission)) {
    origin.admission = config::AdmissionClass::kOpen;
  }
  return origin;
}

Clock::time_point InstanceLiveness::last_seen() const {
  return Clock::time_point(std::chrono::nanoseconds(last_seen_ns.load(std::memory_order_relaxed)));
}

Clock::time_point InstanceLiveness::expires_at() const {
  return Clock::time_point(std::chrono::nanoseconds(expires_at_ns.load(std::memory_order_relaxed)));
}

proto::NodeLoad InstanceLiveness::load() const {
  proto::NodeLoad l;
  l.present = load_present.load(std::memory_order_relaxed);
  l.running = running.load(std::memory_order_relaxed);
  l.waiting = waiting.load(std::memory_order_relaxed);
  l.free_kv_blocks = free_kv_blocks.load(std::memory_order_relaxed);
  return l;
}

void InstanceLiveness::set_last_seen(Clock::time_point t) {
  last_seen_ns.store(std::chrono::nanoseconds(t.time_since_epoch()).count(), std::memory_order_relaxed);
}

void InstanceLiveness::set_expires_at(Clock::time_point t) {
  expires_at_ns.store(std::chrono::nanoseconds(t.time_since_epoch()).count(), std::memory_order_relaxed);
}

void InstanceLiveness::set_load(const proto::NodeLoad& l) {
  load_present.store(l.present, std::memory_order_relaxed);
  running.store(l.running, std::memory_order_relaxed);
  waiting.store(l.waiting, std::memory_order_relaxed);
  free_kv_blocks.store(l.free_kv_blocks, std::memory_order_relaxed);
}

const Instance* RegistrySnapshot::find(std::string_view key) const {
  auto it = std::lower_bound(instances.begin(), instances.end(), key,
                             [](const auto& inst, std::string_view k) { return inst->key < k; });
  if (it == instances.end() || (*it)->key != key) return nullptr;
  return it->get();
}

size_t RegistrySnapshot::count(proto::Role role, InstanceState state) const {
  return static_cast<size_t>(std::count_if(instances.begin(), instances.end(), [&](const auto& inst) {
    return inst->role == role && inst->state == state;
  }));
}

}  // namespace pdr::discovery
