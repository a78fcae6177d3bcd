#include "discovery/registry.h"

#include <algorithm>

namespace pdr::discovery {
namespace {

constexpr Clock::time_point kNever = Clock::time_point::max();

// Fields whose change alters routing or what /status shows beyond liveness.
bool same_shape(const Instance& a, const Instance& b) {
  return a.role == b.role && a.connector == b.connector && a.format == b.format &&
         a.transfer_mode == b.transfer_mode && a.zmq_address == b.zmq_address &&
         a.dp_size == b.dp_size && a.tp_size == b.tp_size && a.bootstrap_port == b.bootstrap_port &&
         a.model == b.model && a.labels == b.labels && a.instance_id == b.instance_id &&
         a.epoch == b.epoch && a.state == b.state && a.source == b.source && a.ttl == b.ttl;
}

Instance instance_from_static(const StaticInstance& s) {
  Instance inst;
  inst.key = s.http_address.to_string();
  inst.role = s.role;
  inst.connector = s.connector;
  inst.format = proto::RegistrationFormat::kStatic;
  inst.transfer_mode = s.transfer_mode;
  inst.http_address = s.http_address;
  inst.zmq_address = s.zmq_address;
  if (proto::looks_like_moriio_zmq_address(s.zmq_address)) {
    proto::MoriioZmqAddress zmq;
    if (proto::parse_moriio_zmq_address(s.zmq_address, &zmq).is_ok()) inst.moriio_zmq = zmq;
  } else if (!s.zmq_address.empty()) {
    proto::HostPort kv;
    if (proto::parse_host_port(s.zmq_address, &kv).is_ok()) inst.kv_address = kv;
  }
  inst.dp_size = s.dp_size;
  inst.tp_size = s.tp_size;
  inst.bootstrap_port = s.bootstrap_port;
  inst.model = s.model;
  inst.labels = s.labels;
  inst.source = InstanceSource::kStatic;
  return inst;
}

}  // namespace

RegistryOptions RegistryOptions::from(const Topology::Discovery& d) {
  RegistryOptions o;
  o.default_ttl = d.ttl;
  o.min_ttl = d.min_ttl;
  o.max_ttl = d.max_ttl;
  o.expired_retention = d.expired_retention;
  o.max_instances = d.max_instances;
  return o;
}

std::string_view to_string(UpsertResult r) {
  switch (r) {
    case UpsertResult::kAdded: return "added";
    case UpsertResult::kUpdated: return "updated";
    case UpsertResult::kRestarted: return "restarted";
    case UpsertResult::kRevived: return "revived";
    case UpsertResult::kRejectedFull: return "rejected_full";
  }
  return "unknown";
}

void apply_registration(const proto::Registration& reg, Instance* inst) {
  inst->key = reg.http_address.to_string();
  inst->role = reg.role;
  inst->connector = reg.connector;
  inst->format = reg.format;
  inst->transfer_mode = reg.transfer_mode;
  inst->http_address = reg.http_address;
  inst->zmq_address = reg.zmq_address;
  inst->moriio_zmq = reg.moriio_zmq;
  inst->kv_address = reg.kv_address;
  inst->dp_size = reg.dp_size;
  inst->tp_size = reg.tp_size;
  inst->bootstrap_port = reg.bootstrap_port;
  inst->model = reg.model;
  inst->labels = reg.labels;
  inst->load = reg.load;
  inst->instance_id = reg.instance_id;
  inst->epoch = reg.epoch;
}

Registry::Registry(RegistryOptions options) : options_(options) {}

void Registry::set_options(const RegistryOptions& options) { options_ = options; }

std::chrono::milliseconds Registry::effective_ttl(const proto::Registration& reg) const {
  if (!reg.ttl_ms) return options_.default_ttl;
  return std::clamp(std::chrono::milliseconds(*reg.ttl_ms), options_.min_ttl, options_.max_ttl);
}

Instance& Registry::mutable_instance(Entry& entry) {
  // Always copy: a published snapshot may share the old object with reader threads. (Checking
  // use_count() == 1 to edit in place would need acquire ordering libstdc++ does not give.)
  auto copy = std::make_shared<Instance>(*entry.instance);
  Instance& ref = *copy;
  entry.instance = std::move(copy);
  return ref;
}

void Registry::set_deadline(EntryMap::iterator it, Clock::time_point deadline) {
  Entry& e = it->second;
  if (e.deadline == deadline) return;
  if (e.deadline != kNever) deadlines_.erase({e.deadline, it->first});
  e.deadline = deadline;
  if (deadline != kNever) deadlines_.emplace(deadline, it->first);
}

void Registry::erase(EntryMap::iterator it) {
  set_deadline(it, kNever);
  entries_.erase(it);
  structural_dirty_ = true;
}

bool Registry::evict_one_expired() {
  // Oldest-expiring expired entry first; only expired entries are evictable.
  for (const auto& [deadline, key] : deadlines_) {
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second.instance->state == InstanceState::kExpired) {
      erase(it);
      return true;
    }
  }
  return false;
}

Registry::UpsertOutcome Registry::upsert(const proto::Registration& reg, Clock::time_point now) {
  const std::chrono::milliseconds ttl = effective_ttl(reg);
  std::string key = reg.http_address.to_string();
  auto it = entries_.find(key);

  if (it == entries_.end()) {
    if (entries_.size() >= options_.max_instances && !evict_one_expired()) {
      return {UpsertResult::kRejectedFull, ttl};
    }
    auto inst = std::make_shared<Instance>();
    apply_registration(reg, inst.get());
    inst->state = reg.draining ? InstanceState::kDraining : InstanceState::kUp;
    inst->source = InstanceSource::kRegistered;
    inst->first_seen = inst->last_seen = now;
    inst->ttl = ttl;
    inst->expires_at = now + ttl;
    inst->messages = 1;
    it = entries_.emplace(std::move(key), Entry{std::move(inst), kNever}).first;
    set_deadline(it, now + ttl);
    structural_dirty_ = true;
    return {UpsertResult::kAdded, ttl};
  }

  Entry& entry = it->second;
  const std::shared_ptr<const Instance> before_ptr = entry.instance;  // keeps the old alive
  const Instance& before = *before_ptr;
  Instance& inst = mutable_instance(entry);
  UpsertResult result = UpsertResult::kUpdated;
  if (before.state == InstanceState::kExpired) {
    result = UpsertResult::kRevived;
  }
  if (reg.epoch != 0 && before.epoch != 0 && reg.epoch != before.epoch) {
    result = UpsertResult::kRestarted;
    inst.restarts++;
    inst.first_seen = now;
  }

  if (before.source == InstanceSource::kRegistered) {
    apply_registration(reg, &inst);
    inst.ttl = ttl;
    inst.expires_at = now + ttl;
    set_deadline(it, now + ttl);
  } else {
    // Static/admin entries: the operator's description stands; the node contributes liveness,
    // load and identity only, and the entry never expires.
    inst.load = reg.load;
    inst.instance_id = reg.instance_id;
    inst.epoch = reg.epoch;
    set_deadline(it, kNever);
  }
  inst.state = reg.draining ? InstanceState::kDraining : InstanceState::kUp;
  inst.last_seen = now;
  inst.messages++;

  if (same_shape(before, inst)) {
    liveness_dirty_ = true;
  } else {
    structural_dirty_ = true;
  }
  return {result, ttl};
}

GoodbyeResult Registry::goodbye(const proto::Goodbye& goodbye, Clock::time_point now) {
  auto it = entries_.find(goodbye.http_address.to_string());
  if (it == entries_.end()) return GoodbyeResult::kUnknown;
  const Instance& current = *it->second.instance;
  if (goodbye.epoch != 0 && current.epoch != 0 && goodbye.epoch < current.epoch) {
    return GoodbyeResult::kStaleEpoch;
  }
  if (current.source == InstanceSource::kRegistered) {
    erase(it);
  } else {
    Instance& inst = mutable_instance(it->second);
    inst.state = InstanceState::kExpired;
    inst.last_seen = now;
    structural_dirty_ = true;
  }
  return GoodbyeResult::kRemoved;
}

void Registry::replace_static(const std::vector<StaticInstance>& instances, Clock::time_point now) {
  std::set<std::string, std::less<>> wanted;
  for (const StaticInstance& s : instances) {
    Instance fresh = instance_from_static(s);
    wanted.insert(fresh.key);
    auto it = entries_.find(fresh.key);
    if (it == entries_.end()) {
      fresh.first_seen = fresh.last_seen = now;
      entries_.emplace(fresh.key, Entry{std::make_shared<Instance>(std::move(fresh)), kNever});
      structural_dirty_ = true;
      continue;
    }
    // Keep what only the node can tell (liveness, load, identity); take the rest from the file.
    const std::shared_ptr<const Instance> old_ptr = it->second.instance;
    const Instance& old = *old_ptr;
    fresh.first_seen = old.first_seen;
    fresh.last_seen = old.last_seen;
    fresh.load = old.load;
    fresh.instance_id = old.instance_id;
    fresh.epoch = old.epoch;
    fresh.messages = old.messages;
    fresh.restarts = old.restarts;
    if (old.state == InstanceState::kDraining) fresh.state = old.state;
    if (!same_shape(old, fresh)) structural_dirty_ = true;
    it->second.instance = std::make_shared<Instance>(std::move(fresh));
    set_deadline(it, kNever);
  }
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->second.instance->source == InstanceSource::kStatic && !wanted.contains(it->first)) {
      erase(it);
    }
    it = next;
  }
}

Registry::ExpireResult Registry::expire_due(Clock::time_point now) {
  ExpireResult result;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    auto it = entries_.find(deadlines_.begin()->second);
    if (it == entries_.end()) {  // cannot happen: erase() always clears the deadline first
      deadlines_.erase(deadlines_.begin());
      continue;
    }
    if (it->second.instance->state == InstanceState::kExpired) {
      erase(it);
      result.removed++;
      continue;
    }
    Instance& inst = mutable_instance(it->second);
    inst.state = InstanceState::kExpired;
    set_deadline(it, now + options_.expired_retention);
    structural_dirty_ = true;
    result.expired++;
  }
  return result;
}

std::optional<Clock::time_point> Registry::next_deadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

RegistrySnapshotPtr Registry::snapshot(Clock::time_point now) {
  auto snap = std::make_shared<RegistrySnapshot>();
  snap->version = ++version_;
  snap->taken_at = now;
  snap->instances.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) snap->instances.push_back(entry.instance);
  structural_dirty_ = liveness_dirty_ = false;
  return snap;
}

}  // namespace pdr::discovery
