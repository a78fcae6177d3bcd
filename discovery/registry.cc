#include "discovery/registry.h"

#include <algorithm>
#include <set>

namespace pdr::discovery {
namespace {

// The state of an entry that has not expired.
InstanceState live_state(bool node_draining, bool operator_drain) {
  return node_draining || operator_drain ? InstanceState::kDraining : InstanceState::kUp;
}

Instance instance_from_spec(const config::StaticInstance& spec, InstanceSource source) {
  Instance inst;
  static_cast<proto::NodeSpec&>(inst) = spec;
  proto::fill_parsed_zmq_address(&inst);
  inst.key = spec.http_address.to_string();
  inst.format = proto::RegistrationFormat::kStatic;
  inst.source = source;
  return inst;
}

}  // namespace

RegistryOptions RegistryOptions::from(const config::Topology::Discovery& d) {
  RegistryOptions o;
  o.default_ttl = d.ttl;
  o.min_ttl = d.min_ttl;
  o.max_ttl = d.max_ttl;
  o.expired_retention = d.expired_retention;
  o.max_instances = d.max_instances;
  o.max_per_class = d.max_instances_per_class;
  return o;
}

std::string_view to_string(AdminResult r) {
  switch (r) {
    case AdminResult::kCreated: return "created";
    case AdminResult::kReplaced: return "replaced";
    case AdminResult::kOk: return "ok";
    case AdminResult::kNotFound: return "not_found";
    case AdminResult::kConflict: return "conflict";
    case AdminResult::kRejectedFull: return "rejected_full";
  }
  return "unknown";
}

std::string_view to_string(UpsertResult r) {
  switch (r) {
    case UpsertResult::kAdded: return "added";
    case UpsertResult::kUpdated: return "updated";
    case UpsertResult::kRestarted: return "restarted";
    case UpsertResult::kRevived: return "revived";
    case UpsertResult::kRejectedFull: return "rejected_full";
    case UpsertResult::kRejectedClassFull: return "rejected_class_full";
    case UpsertResult::kRejectedWeaker: return "rejected_weaker";
    case UpsertResult::kRejectedStaleEpoch: return "rejected_stale_epoch";
  }
  return "unknown";
}

std::string_view to_string(GoodbyeResult r) {
  switch (r) {
    case GoodbyeResult::kRemoved: return "removed";
    case GoodbyeResult::kUnknown: return "unknown";
    case GoodbyeResult::kStaleEpoch: return "stale_epoch";
    case GoodbyeResult::kWeaker: return "weaker";
    case GoodbyeResult::kOperatorOwned: return "operator_owned";
  }
  return "unknown";
}

void apply_registration(const proto::Registration& reg, Instance* inst) {
  static_cast<proto::NodeSpec&>(*inst) = reg;
  inst->key = reg.http_address.to_string();
  inst->format = reg.format;
  inst->instance_id = reg.instance_id;
  inst->epoch = reg.epoch;
}

bool registration_matches(const proto::Registration& reg, const Instance& inst) {
  return static_cast<const proto::NodeSpec&>(inst) == reg && inst.format == reg.format &&
         inst.instance_id == reg.instance_id && inst.epoch == reg.epoch;
}

Registry::Registry(RegistryOptions options) : options_(options) {}

void Registry::set_options(const RegistryOptions& options) { options_ = options; }

std::chrono::milliseconds Registry::effective_ttl(const proto::Registration& reg) const {
  if (!reg.ttl_ms) return options_.default_ttl;
  return std::clamp(std::chrono::milliseconds(*reg.ttl_ms), options_.min_ttl, options_.max_ttl);
}

Instance& Registry::mutable_instance(Entry& entry) {
  // Always copy: a published snapshot may share the old object with reader threads.
  auto copy = std::make_shared<Instance>(*entry.instance);
  Instance& ref = *copy;
  entry.instance = std::move(copy);
  return ref;
}

void Registry::set_deadline(EntryMap::iterator it, Clock::time_point deadline) {
  Entry& e = it->second;
  e.deadline = deadline;
  e.instance->liveness->set_expires_at(
      e.instance->state == InstanceState::kExpired ? kNever : deadline);
  // Later deadlines ride on the existing heap item (rescheduled when it surfaces); only an
  // earlier one needs a new item. The superseded item is recognised as stale and dropped.
  if (deadline < e.scheduled) {
    e.scheduled = deadline;
    heap_.emplace_back(deadline, it->first);
    std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
  }
}

void Registry::erase(EntryMap::iterator it) {
  unmark_expired(it);
  const Instance& inst = *it->second.instance;
  if (inst.source == InstanceSource::kRegistered) count_by_class_[static_cast<size_t>(inst.admission)]--;
  entries_.erase(it);  // its heap item, if any, becomes stale
  dirty_ = true;
}

void Registry::mark_expired(EntryMap::iterator it, Clock::time_point now) {
  const Instance& inst = *it->second.instance;
  if (inst.source != InstanceSource::kRegistered || it->second.expired_at != kNever) return;
  it->second.expired_at = now;
  expired_[static_cast<size_t>(inst.admission)].emplace(now, it->first);
}

void Registry::unmark_expired(EntryMap::iterator it) {
  Entry& e = it->second;
  if (e.expired_at == kNever) return;
  expired_[static_cast<size_t>(e.instance->admission)].erase({e.expired_at, it->first});
  e.expired_at = kNever;
}

bool Registry::evict_one_expired(std::optional<config::AdmissionClass> only) {
  // Only expired entries are evictable; take the one that has been expired longest.
  const ExpiredIndex::value_type* oldest = nullptr;
  for (size_t c = 0; c < config::kAdmissionClasses; ++c) {
    if (only && static_cast<size_t>(*only) != c) continue;
    if (expired_[c].empty()) continue;
    const auto& head = *expired_[c].begin();
    if (oldest == nullptr || head.first < oldest->first) oldest = &head;
  }
  if (oldest == nullptr) return false;
  auto it = entries_.find(oldest->second);
  if (it == entries_.end()) return false;  // cannot happen: erase() unindexes
  erase(it);
  return true;
}

UpsertResult Registry::make_room(config::AdmissionClass c) {
  const size_t cls = static_cast<size_t>(c);
  if (count_by_class_[cls] >= options_.max_per_class[cls] && !evict_one_expired(c)) {
    return UpsertResult::kRejectedClassFull;
  }
  if (entries_.size() >= options_.max_instances && !evict_one_expired()) return UpsertResult::kRejectedFull;
  return UpsertResult::kAdded;
}

Registry::UpsertOutcome Registry::upsert(const proto::Registration& reg, Clock::time_point now,
                                         config::AdmissionClass sender) {
  const std::chrono::milliseconds ttl = effective_ttl(reg);
  auto it = entries_.find(reg.http_address.to_string());
  if (it != entries_.end() && it->second.instance->source == InstanceSource::kReplica) {
    const Instance& replica = *it->second.instance;
    if (replica.replica_of_operator_entry) {
      // The operator described it on its replica: as for a local static entry, the node's
      // messages keep it live here and change nothing else.
      InstanceLiveness& live = *replica.liveness;
      live.set_last_seen(now);
      live.set_load(reg.load);
      live.messages.fetch_add(1, std::memory_order_relaxed);
      return {UpsertResult::kUpdated, ttl};
    }
    // A weaker sender here cannot replace what a stronger one registered on another replica.
    if (sender < replica.admission) return {UpsertResult::kRejectedWeaker, ttl};
    // The node now talks to this replica: its entry becomes a local registered one (one
    // snapshot, no gap in routing).
    erase(it);
    it = entries_.end();
  }

  if (it == entries_.end()) {
    if (const UpsertResult room = make_room(sender); room != UpsertResult::kAdded) return {room, ttl};
    auto inst = std::make_shared<Instance>();
    inst->admission = sender;
    count_by_class_[static_cast<size_t>(sender)]++;
    apply_registration(reg, inst.get());
    inst->node_draining = reg.draining;
    inst->state = live_state(reg.draining, false);
    inst->source = InstanceSource::kRegistered;
    inst->first_seen = now;
    inst->ttl = ttl;
    inst->liveness->set_last_seen(now);
    inst->liveness->set_load(reg.load);
    inst->liveness->messages.store(1, std::memory_order_relaxed);
    std::string key = inst->key;
    it = entries_.emplace(std::move(key), Entry{std::move(inst)}).first;
    set_deadline(it, now + ttl);
    dirty_ = true;
    return {UpsertResult::kAdded, ttl};
  }

  Entry& entry = it->second;
  const Instance& current = *entry.instance;
  const bool registered = current.source == InstanceSource::kRegistered;
  // A weaker sender changes nothing of an entry a stronger one created, not even its liveness
  // (which would keep a dead node routable).
  if (registered && sender < current.admission) return {UpsertResult::kRejectedWeaker, ttl};
  // Epochs are the node's start time: an older one is a delayed or replayed message.
  if (reg.epoch != 0 && current.epoch != 0 && reg.epoch < current.epoch) {
    return {UpsertResult::kRejectedStaleEpoch, ttl};
  }
  UpsertResult result = current.state == InstanceState::kExpired ? UpsertResult::kRevived
                                                                 : UpsertResult::kUpdated;
  const bool restarted = reg.epoch != 0 && current.epoch != 0 && reg.epoch != current.epoch;
  if (restarted) result = UpsertResult::kRestarted;
  const bool upgraded = registered && sender > current.admission;
  // The node's own drain flag counts on an operator entry only from an authenticated sender.
  const bool node_draining = registered || authenticated(sender) ? reg.draining : current.node_draining;

  // Static/admin entries: the operator's description stands; the node contributes liveness,
  // load and identity only, and the entry never expires.
  const bool same = registered ? registration_matches(reg, current) && current.ttl == ttl
                               : current.instance_id == reg.instance_id && current.epoch == reg.epoch;
  // An operator drain outlives whatever the node says.
  const InstanceState state = live_state(node_draining, current.operator_drain);
  if (!same || restarted || upgraded || current.state != state || current.node_draining != node_draining) {
    if (current.state == InstanceState::kExpired) unmark_expired(it);
    Instance& inst = mutable_instance(entry);
    if (registered) {
      apply_registration(reg, &inst);
      inst.ttl = ttl;
      if (upgraded) {
        count_by_class_[static_cast<size_t>(inst.admission)]--;
        count_by_class_[static_cast<size_t>(sender)]++;
        inst.admission = sender;
      }
    } else {
      inst.instance_id = reg.instance_id;
      inst.epoch = reg.epoch;
    }
    if (restarted) {
      inst.restarts++;
      inst.first_seen = now;
      // A node that says it restarted is worth a try at once, whatever its old self did
      // (router/routing/ejection.h).
      inst.liveness->connect_failures.store(0, std::memory_order_relaxed);
      inst.liveness->ejected_until_ns.store(0, std::memory_order_relaxed);
    }
    inst.node_draining = node_draining;
    inst.state = state;
    dirty_ = true;
  }
  // The heartbeat proper: atomics only.
  InstanceLiveness& live = *entry.instance->liveness;
  live.set_last_seen(now);
  live.set_load(reg.load);
  live.messages.fetch_add(1, std::memory_order_relaxed);
  set_deadline(it, registered ? now + ttl : kNever);
  return {result, ttl};
}

GoodbyeResult Registry::goodbye(const proto::Goodbye& goodbye, Clock::time_point, config::AdmissionClass sender) {
  auto it = entries_.find(goodbye.http_address.to_string());
  if (it == entries_.end()) return GoodbyeResult::kUnknown;
  const Instance& current = *it->second.instance;
  if (current.source != InstanceSource::kRegistered) return GoodbyeResult::kOperatorOwned;
  if (sender < current.admission) return GoodbyeResult::kWeaker;
  if (current.epoch != 0 && goodbye.epoch != current.epoch) return GoodbyeResult::kStaleEpoch;
  erase(it);
  return GoodbyeResult::kRemoved;
}

std::shared_ptr<const Instance> Registry::insert_never_expiring(Instance fresh, Clock::time_point now) {
  fresh.first_seen = now;
  fresh.liveness->set_last_seen(now);
  fresh.liveness->set_expires_at(kNever);
  std::string key = fresh.key;
  auto it = entries_.emplace(std::move(key), Entry{std::make_shared<Instance>(std::move(fresh))}).first;
  dirty_ = true;
  return it->second.instance;
}

bool Registry::take_over(EntryMap::iterator it, Instance fresh) {
  unmark_expired(it);
  const Instance& old = *it->second.instance;
  if (old.source == InstanceSource::kRegistered) count_by_class_[static_cast<size_t>(old.admission)]--;
  fresh.first_seen = old.first_seen;
  fresh.liveness = old.liveness;
  fresh.instance_id = old.instance_id;
  fresh.epoch = old.epoch;
  fresh.restarts = old.restarts;
  fresh.node_draining = old.node_draining;
  fresh.operator_drain = old.operator_drain;
  fresh.state = live_state(fresh.node_draining, fresh.operator_drain);
  // fresh now carries old's liveness and history, so it differs from old only in what the
  // operator's description, the source or the state changed.
  const bool changed = !(fresh == old);
  it->second.instance = std::make_shared<Instance>(std::move(fresh));
  it->second.deadline = kNever;  // never expires; a pending heap item goes stale
  it->second.instance->liveness->set_expires_at(kNever);
  return changed;
}

void Registry::replace_static(const std::vector<config::StaticInstance>& instances, Clock::time_point now) {
  std::set<std::string, std::less<>> wanted;
  for (const config::StaticInstance& s : instances) {
    Instance fresh = instance_from_spec(s, InstanceSource::kStatic);
    wanted.insert(fresh.key);
    auto it = entries_.find(fresh.key);
    if (it == entries_.end()) {
      insert_never_expiring(std::move(fresh), now);
    } else if (take_over(it, std::move(fresh))) {
      dirty_ = true;
    }
  }
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (it->second.instance->source == InstanceSource::kStatic && !wanted.contains(it->first)) {
      erase(it);
    }
    it = next;
  }
}

AdminOutcome Registry::add_admin(const config::StaticInstance& spec, Clock::time_point now) {
  Instance fresh = instance_from_spec(spec, InstanceSource::kAdmin);
  auto it = entries_.find(fresh.key);
  if (it == entries_.end()) {
    if (entries_.size() >= options_.max_instances && !evict_one_expired()) {
      return {AdminResult::kRejectedFull, nullptr,
              "registry full (" + std::to_string(entries_.size()) +
                  " instances, discovery.max_instances); nothing expired to evict"};
    }
    return {AdminResult::kCreated, insert_never_expiring(std::move(fresh), now), ""};
  }
  const std::shared_ptr<const Instance>& current = it->second.instance;
  if (current->source == InstanceSource::kStatic) {
    return {AdminResult::kConflict, current,
            current->key + " is a static instance from the topology file; edit it there"};
  }
  if (current->source == InstanceSource::kAdmin) {
    return {AdminResult::kConflict, current,
            current->key + " was already added through the admin API; delete it first to change it"};
  }
  if (take_over(it, std::move(fresh))) dirty_ = true;
  return {AdminResult::kReplaced, it->second.instance, ""};
}

AdminOutcome Registry::remove(std::string_view key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return {AdminResult::kNotFound, nullptr, std::string(key) + " is not in the registry"};
  std::shared_ptr<const Instance> removed = it->second.instance;
  if (removed->source == InstanceSource::kStatic) {
    return {AdminResult::kConflict, std::move(removed),
            std::string(key) + " is a static instance from the topology file; remove it there (or drain it)"};
  }
  erase(it);
  return {AdminResult::kOk, std::move(removed), ""};
}

AdminOutcome Registry::set_operator_drain(std::string_view key, bool drain) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return {AdminResult::kNotFound, nullptr, std::string(key) + " is not in the registry"};
  if (it->second.instance->operator_drain != drain) {
    Instance& inst = mutable_instance(it->second);
    inst.operator_drain = drain;
    if (inst.state != InstanceState::kExpired) inst.state = live_state(inst.node_draining, drain);
    dirty_ = true;
  }
  return {AdminResult::kOk, it->second.instance, ""};
}

Registry::ExpireResult Registry::expire_due(Clock::time_point now) {
  ExpireResult result;
  while (!heap_.empty() && heap_.front().first <= now) {
    std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
    auto [when, key] = std::move(heap_.back());
    heap_.pop_back();
    auto it = entries_.find(key);
    if (it == entries_.end() || it->second.scheduled != when) continue;  // stale item
    Entry& entry = it->second;
    entry.scheduled = kNever;
    if (entry.deadline > now) {  // extended by heartbeats since: reschedule
      set_deadline(it, entry.deadline);
      continue;
    }
    if (entry.instance->state == InstanceState::kExpired) {
      erase(it);
      result.removed++;
      continue;
    }
    Instance& inst = mutable_instance(entry);
    inst.state = InstanceState::kExpired;
    set_deadline(it, now + options_.expired_retention);
    mark_expired(it, now);
    dirty_ = true;
    result.expired++;
  }
  return result;
}

std::optional<Clock::time_point> Registry::next_deadline() const {
  // May be earlier than the true next event (a stale or not-yet-rescheduled item): the caller
  // then wakes once for nothing, which is harmless.
  if (heap_.empty()) return std::nullopt;
  return heap_.front().first;
}

RegistrySnapshotPtr Registry::snapshot(Clock::time_point now) {
  auto snap = std::make_shared<RegistrySnapshot>();
  snap->version = ++version_;
  snap->taken_at = now;
  snap->instances.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) snap->instances.push_back(entry.instance);
  snap->count_by_class = count_by_class_;
  snap->routable = RoutableIndex::build(snap->instances);  // pairing's index, once per snapshot
  dirty_ = false;
  return snap;
}

AdminOutcome Registry::upsert_replica(const proto::Registration& reg, ReplicaOrigin origin, Clock::time_point now) {
  return upsert_owned(reg, InstanceSource::kReplica, origin, now);
}

AdminOutcome Registry::upsert_kubernetes(const proto::Registration& reg, Clock::time_point now) {
  return upsert_owned(reg, InstanceSource::kKubernetes, ReplicaOrigin{}, now);
}

AdminOutcome Registry::remove_replica(std::string_view key) { return remove_owned(key, InstanceSource::kReplica); }

AdminOutcome Registry::remove_kubernetes(std::string_view key) {
  return remove_owned(key, InstanceSource::kKubernetes);
}

AdminOutcome Registry::upsert_owned(const proto::Registration& reg, InstanceSource source, ReplicaOrigin origin,
                                    Clock::time_point now) {
  const std::string key = reg.http_address.to_string();
  auto it = entries_.find(key);
  // What another replica published gives way to what this replica sees itself.
  if (it != entries_.end() && source == InstanceSource::kKubernetes &&
      it->second.instance->source == InstanceSource::kReplica) {
    erase(it);
    it = entries_.end();
  }
  // ... unless this replica's entry came from a weaker sender than the other replica's: the
  // weaker-sender rule, across replicas (the weaker one may have registered here first).
  bool replaced = false;
  if (it != entries_.end() && source == InstanceSource::kReplica &&
      it->second.instance->source == InstanceSource::kRegistered &&
      (origin.operator_entry || it->second.instance->admission < origin.admission)) {
    erase(it);
    it = entries_.end();
    replaced = true;
  }
  if (it != entries_.end() && it->second.instance->source != source) {
    return {AdminResult::kConflict, it->second.instance, "a local entry owns " + key};
  }
  if (it == entries_.end()) {
    if (entries_.size() >= options_.max_instances && !evict_one_expired()) {
      return {AdminResult::kRejectedFull, nullptr, "registry full"};
    }
    auto inst = std::make_shared<Instance>();
    apply_registration(reg, inst.get());
    inst->source = source;
    if (source == InstanceSource::kReplica) {
      inst->admission = origin.admission;
      inst->replica_of_operator_entry = origin.operator_entry;
    }
    inst->node_draining = reg.draining;
    inst->state = live_state(reg.draining, false);
    inst->first_seen = now;
    inst->liveness->set_last_seen(now);
    inst->liveness->set_load(reg.load);
    it = entries_.emplace(key, Entry{std::move(inst)}).first;
    set_deadline(it, kNever);
    dirty_ = true;
    return {replaced ? AdminResult::kReplaced : AdminResult::kCreated, it->second.instance, ""};
  }
  const Instance& current = *it->second.instance;
  const InstanceState state = live_state(reg.draining, current.operator_drain);
  const bool origin_changed = source == InstanceSource::kReplica &&
                              !(ReplicaOrigin{current.admission, current.replica_of_operator_entry} == origin);
  if (!registration_matches(reg, current) || current.node_draining != reg.draining || current.state != state ||
      current.epoch != reg.epoch || origin_changed) {
    Instance& inst = mutable_instance(it->second);
    apply_registration(reg, &inst);
    inst.node_draining = reg.draining;
    inst.state = state;
    if (source == InstanceSource::kReplica) {
      inst.admission = origin.admission;
      inst.replica_of_operator_entry = origin.operator_entry;
    }
    dirty_ = true;
  }
  it->second.instance->liveness->set_last_seen(now);
  it->second.instance->liveness->set_load(reg.load);
  return {AdminResult::kOk, it->second.instance, ""};
}

AdminOutcome Registry::remove_owned(std::string_view key, InstanceSource source) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.instance->source != source) {
    return {AdminResult::kNotFound, nullptr, "no " + std::string(to_string(source)) + " entry " + std::string(key)};
  }
  auto removed = it->second.instance;
  erase(it);
  return {AdminResult::kOk, std::move(removed), ""};
}

}  // namespace pdr::discovery
