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
  }
  return "unknown";
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
