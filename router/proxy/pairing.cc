#include "router/proxy/pairing.h"

#include <algorithm>

#include "proto/dialects/dialect.h"
#include "router/proxy/ejection.h"
#include <string>
#include <vector>

namespace pdr::router::proxy {

using discovery::Instance;
using discovery::InstanceState;
using discovery::RegistrySnapshot;
using proto::Connector;
using proto::Role;

// One dialect for both legs (proto/dialects/dialect.h): same connector, and the same mode where
// the connector's dialects differ by mode.
bool compatible(const Instance& p, const Instance& d) {
  const proto::Dialect* dialect = proto::dialect_for(p.connector, p.transfer_mode);
  return dialect != nullptr && dialect == proto::dialect_for(d.connector, d.transfer_mode);
}

bool routable(const Instance& i) { return i.state == InstanceState::kUp; }

bool serves_model(const Instance& i, std::string_view model) {
  return i.model.empty() || model.empty() || i.model == model;
}

namespace {

bool contains(std::span<const std::string> keys, std::string_view key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

Candidate candidate_of(const Instance& i) {
  return Candidate{i.key, i.liveness->outstanding.load(std::memory_order_relaxed),
                   std::max<uint32_t>(1, i.dp_size)};
}

// The usable instances of one role for this query.
std::vector<const InstancePtr*> usable(const RegistrySnapshot& s, Role role, std::string_view model,
                                       std::span<const std::string> excluded) {
  std::vector<const InstancePtr*> out;
  for (const auto& inst : s.instances) {
    if (inst->role == role && routable(*inst) && inst->connector != Connector::kUnknown && serves_model(*inst, model) &&
        !contains(excluded, inst->key)) {
      out.push_back(&inst);
    }
  }
  return out;
}

// Leaves out the ejected candidates unless that would leave none (see the header).
void prefer_not_ejected(std::vector<const InstancePtr*>& pool, discovery::Clock::time_point now) {
  if (now == discovery::Clock::time_point{}) return;
  auto is_ejected = [now](const InstancePtr* i) { return ejected(*(*i)->liveness, now); };
  if (std::all_of(pool.begin(), pool.end(), is_ejected)) return;
  std::erase_if(pool, is_ejected);
}

const InstancePtr* pick(std::vector<const InstancePtr*>& pool, Policy& policy, const RequestSummary& summary) {
  std::vector<Candidate> candidates;
  candidates.reserve(pool.size());
  for (const InstancePtr* i : pool) candidates.push_back(candidate_of(**i));
  const size_t index = policy.pick(candidates, summary);
  return pool[std::min(index, pool.size() - 1)];
}

std::string model_suffix(std::string_view model) {
  return model.empty() ? std::string() : " serving model '" + std::string(model) + "'";
}

// The index of a snapshot built by the registry, or one built now for a hand-made snapshot.
const discovery::RoutableIndex& index_of(const RegistrySnapshot& s, discovery::RoutableIndex* local) {
  if (s.routable.built) return s.routable;
  *local = discovery::RoutableIndex::build(s.instances);
  return *local;
}

bool pairable_class(const discovery::RoutableGroup& g) {
  return proto::dialect_for(g.connector, g.transfer_mode) != nullptr;
}

// The members of `group` serving the query's model and not excluded.
std::vector<const InstancePtr*> candidates(const discovery::RoutableGroup& group, std::string_view model,
                                           std::span<const std::string> excluded, size_t* visited) {
  std::vector<const InstancePtr*> out = group.serving(model);
  if (visited != nullptr) *visited += out.size();
  if (!excluded.empty()) std::erase_if(out, [&](const InstancePtr* i) { return contains(excluded, (*i)->key); });
  return out;
}

// Why no pair exists, from a scan of the whole snapshot (the failure path only).
Status no_pair_reason(const RegistrySnapshot& s, const PairQuery& q) {
  auto prefills = usable(s, Role::kPrefill, q.model, q.excluded_prefills);
  auto decodes = usable(s, Role::kDecode, q.model, q.excluded_decodes);
  if (prefills.empty()) {
    return Status(StatusCode::kNotFound, "no prefill instance is up with a known connector" + model_suffix(q.model) +
                                             (q.excluded_prefills.empty() ? "" : " (besides those already tried)"));
  }
  if (decodes.empty()) {
    return Status(StatusCode::kNotFound, "no decode instance is up with a known connector" + model_suffix(q.model) +
                                             (q.excluded_decodes.empty() ? "" : " (besides those already tried)"));
  }
  const Instance& p = **prefills.front();
  const Instance& d = **decodes.front();
  return Status(StatusCode::kNotFound,
                "no decode instance is compatible with any prefill instance (connector and transfer mode "
                "must match; e.g. prefill " + p.key + " is " + std::string(proto::to_string(p.connector)) +
                    "/" + std::string(proto::to_string(p.transfer_mode)) + ", decode " + d.key + " is " +
                    std::string(proto::to_string(d.connector)) + "/" +
                    std::string(proto::to_string(d.transfer_mode)) + ")");
}

}  // namespace

Status choose_pair(const RegistrySnapshot& s, const PairQuery& q, Policy& prefill_policy, Policy& decode_policy,
                   Pair* out) {
  discovery::RoutableIndex local;
  const discovery::RoutableIndex& index = index_of(s, &local);
  // Per compatibility class with both sides present: its usable prefills, and its usable decodes.
  struct ClassCandidates {
    std::vector<const InstancePtr*> prefills, decodes;
  };
  std::vector<ClassCandidates> classes;
  for (const discovery::RoutableGroup& pg : index.groups) {
    if (pg.role != Role::kPrefill || !pairable_class(pg)) continue;
    const discovery::RoutableGroup* dg = index.find(Role::kDecode, pg.connector, pg.transfer_mode);
    if (dg == nullptr) continue;
    ClassCandidates c;
    c.decodes = candidates(*dg, q.model, q.excluded_decodes, q.visited);
    if (c.decodes.empty()) continue;
    c.prefills = candidates(pg, q.model, q.excluded_prefills, q.visited);
    if (!c.prefills.empty()) classes.push_back(std::move(c));
  }
  if (classes.empty()) return no_pair_reason(s, q);
  // Key order across classes, as one scan of the snapshot gave (policies index into this list).
  std::vector<const InstancePtr*> pairable;
  for (const ClassCandidates& c : classes) pairable.insert(pairable.end(), c.prefills.begin(), c.prefills.end());
  if (classes.size() > 1) {
    std::sort(pairable.begin(), pairable.end(),
              [](const InstancePtr* a, const InstancePtr* b) { return (*a)->key < (*b)->key; });
  }
  prefer_not_ejected(pairable, q.now);
  const InstancePtr* prefill = pick(pairable, prefill_policy, q.summary);
  std::vector<const InstancePtr*> matching;
  for (const ClassCandidates& c : classes) {
    if (compatible(**prefill, **c.decodes.front())) {
      matching = c.decodes;
      break;
    }
  }
  prefer_not_ejected(matching, q.now);
  out->prefill = *prefill;
  out->decode = *pick(matching, decode_policy, q.summary);
  return Status::ok();
}

Status choose_decode(const RegistrySnapshot& s, const Instance& prefill, const PairQuery& q, Policy& decode_policy,
                     InstancePtr* out) {
  discovery::RoutableIndex local;
  const discovery::RoutableIndex& index = index_of(s, &local);
  std::vector<const InstancePtr*> decodes;
  const proto::TransferMode mode = proto::pairing_mode(prefill.connector, prefill.transfer_mode);
  if (const discovery::RoutableGroup* dg = index.find(Role::kDecode, prefill.connector, mode)) {
    decodes = candidates(*dg, q.model, q.excluded_decodes, q.visited);
    std::erase_if(decodes, [&](const InstancePtr* d) { return !compatible(prefill, **d); });
  }
  if (decodes.empty()) {
    return Status(StatusCode::kNotFound, "no other decode instance compatible with prefill " + prefill.key);
  }
  prefer_not_ejected(decodes, q.now);
  *out = *pick(decodes, decode_policy, q.summary);
  return Status::ok();
}

std::optional<uint32_t> next_dp_rank(const Instance& instance) { return next_dp_rank(instance, instance.dp_size); }

std::optional<uint32_t> next_dp_rank(const Instance& instance, uint32_t dp_size) {
  if (dp_size <= 1) return std::nullopt;
  return instance.liveness->next_dp_rank.fetch_add(1, std::memory_order_relaxed) % dp_size;
}

Status any_pair(const RegistrySnapshot& s) {
  discovery::RoutableIndex local;
  const discovery::RoutableIndex& index = index_of(s, &local);
  bool prefill_up = false, decode_up = false;
  for (const discovery::RoutableGroup& g : index.groups) {
    (g.role == Role::kPrefill ? prefill_up : decode_up) = true;
    if (g.role == Role::kPrefill && pairable_class(g) &&
        index.find(Role::kDecode, g.connector, g.transfer_mode) != nullptr) {
      return Status::ok();
    }
  }
  if (!prefill_up) return Status(StatusCode::kNotFound, "no prefill instance is up");
  if (!decode_up) return Status(StatusCode::kNotFound, "no decode instance is up");
  return Status(StatusCode::kNotFound, "no decode instance is compatible with any prefill instance");
}

}  // namespace pdr::router::proxy
