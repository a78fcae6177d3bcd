#include "router/proxy/pairing.h"

#include <algorithm>

#include "router/proxy/ejection.h"
#include <string>
#include <vector>

namespace pdr::router::proxy {

using discovery::Instance;
using discovery::InstanceState;
using discovery::RegistrySnapshot;
using proto::Connector;
using proto::Role;

bool compatible(const Instance& p, const Instance& d) {
  if (p.connector != d.connector || p.connector == Connector::kUnknown) return false;
  if (p.connector == Connector::kMoriio) {
    return p.transfer_mode == d.transfer_mode && p.transfer_mode != proto::TransferMode::kNone;
  }
  return true;
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

}  // namespace

Status choose_pair(const RegistrySnapshot& s, const PairQuery& q, Policy& prefill_policy, Policy& decode_policy,
                   Pair* out) {
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
  std::vector<const InstancePtr*> pairable;
  for (const InstancePtr* p : prefills) {
    for (const InstancePtr* d : decodes) {
      if (compatible(**p, **d)) {
        pairable.push_back(p);
        break;
      }
    }
  }
  if (pairable.empty()) {
    const Instance& p = **prefills.front();
    const Instance& d = **decodes.front();
    return Status(StatusCode::kNotFound,
                  "no decode instance is compatible with any prefill instance (connector and transfer mode "
                  "must match; e.g. prefill " + p.key + " is " + std::string(proto::to_string(p.connector)) +
                      "/" + std::string(proto::to_string(p.transfer_mode)) + ", decode " + d.key + " is " +
                      std::string(proto::to_string(d.connector)) + "/" +
                      std::string(proto::to_string(d.transfer_mode)) + ")");
  }
  prefer_not_ejected(pairable, q.now);
  const InstancePtr* prefill = pick(pairable, prefill_policy, q.summary);
  std::vector<const InstancePtr*> matching;
  for (const InstancePtr* d : decodes) {
    if (compatible(**prefill, **d)) matching.push_back(d);
  }
  prefer_not_ejected(matching, q.now);
  out->prefill = *prefill;
  out->decode = *pick(matching, decode_policy, q.summary);
  return Status::ok();
}

Status choose_decode(const RegistrySnapshot& s, const Instance& prefill, const PairQuery& q, Policy& decode_policy,
                     InstancePtr* out) {
  auto decodes = usable(s, Role::kDecode, q.model, q.excluded_decodes);
  std::erase_if(decodes, [&](const InstancePtr* d) { return !compatible(prefill, **d); });
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
  auto prefills = usable(s, Role::kPrefill, {}, {});
  auto decodes = usable(s, Role::kDecode, {}, {});
  if (prefills.empty()) return Status(StatusCode::kNotFound, "no prefill instance is up");
  if (decodes.empty()) return Status(StatusCode::kNotFound, "no decode instance is up");
  for (const InstancePtr* p : prefills) {
    for (const InstancePtr* d : decodes) {
      if (compatible(**p, **d)) return Status::ok();
    }
  }
  return Status(StatusCode::kNotFound, "no decode instance is compatible with any prefill instance");
}

}  // namespace pdr::router::proxy
