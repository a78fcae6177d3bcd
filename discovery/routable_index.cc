// RoutableIndex: pairing's per-snapshot index; the contract is in instance.h.
#include <algorithm>

#include "discovery/instance.h"
#include "proto/dialects/dialect.h"

namespace pdr::discovery {

namespace {

using InstancePtr = std::shared_ptr<const Instance>;

// The mode matters where the connector's dialects differ by it (MoRIIO pairs READ with READ and
// WRITE with WRITE); the other connectors ignore it (proto/dialects/dialect.h).
proto::TransferMode class_mode(proto::Connector connector, proto::TransferMode mode) {
  return proto::pairing_mode(connector, mode);
}

}  // namespace

void RoutableGroup::serving(std::string_view model, std::vector<const InstancePtr*>* out) const {
  if (model.empty()) {
    for (const auto& i : all) out->push_back(&i);
    return;
  }
  auto it = by_model.find(model);
  const std::vector<InstancePtr>* named = it != by_model.end() ? &it->second : nullptr;
  auto a = any_model.begin();
  if (named != nullptr) {
    for (auto n = named->begin(); n != named->end(); ++n) {
      while (a != any_model.end() && (*a)->key < (*n)->key) out->push_back(&*a++);
      out->push_back(&*n);
    }
  }
  while (a != any_model.end()) out->push_back(&*a++);
}

RoutableIndex RoutableIndex::build(const std::vector<InstancePtr>& instances) {
  RoutableIndex index;
  index.built = true;
  for (const InstancePtr& inst : instances) {
    if (inst->state != InstanceState::kUp || inst->connector == proto::Connector::kUnknown) continue;
    const proto::TransferMode mode = class_mode(inst->connector, inst->transfer_mode);
    RoutableGroup* group = nullptr;
    for (RoutableGroup& g : index.groups) {
      if (g.role == inst->role && g.connector == inst->connector && g.transfer_mode == mode) group = &g;
    }
    if (group == nullptr) {
      group = &index.groups.emplace_back();
      group->role = inst->role;
      group->connector = inst->connector;
      group->transfer_mode = mode;
    }
    group->all.push_back(inst);  // `instances` is in key order, so every list stays in it
    if (inst->model.empty()) {
      group->any_model.push_back(inst);
    } else {
      group->by_model[inst->model].push_back(inst);
    }
  }
  return index;
}

const RoutableGroup* RoutableIndex::find(proto::Role role, proto::Connector connector,
                                         proto::TransferMode transfer_mode) const {
  for (const RoutableGroup& g : groups) {
    if (g.role == role && g.connector == connector && g.transfer_mode == transfer_mode) return &g;
  }
  return nullptr;
}

}  // namespace pdr::discovery
