#include "router/routing/pairing.h"

#include <algorithm>
#include <chrono>

#include "discovery/engine_load.h"
#include "discovery/load_charge.h"
#include "proto/dialects/dialect.h"
#include "router/routing/ejection.h"
#include <span>
#include <string>
#include <vector>

namespace pdr::router::routing {

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

const InstancePtr* least_loaded_node(const std::vector<const InstancePtr*>& nodes, size_t start) {
  const InstancePtr* best = nullptr;
  Candidate best_load;
  for (size_t n = 0; n < nodes.size(); ++n) {
    const InstancePtr* node = nodes[(start + n) % nodes.size()];
    const Candidate load{(*node)->key, (*node)->liveness->outstanding.load(std::memory_order_relaxed),
                         std::max<uint32_t>(1, (*node)->dp_size)};
    if (best == nullptr || less_loaded(load, best_load)) {
      best = node;
      best_load = load;
    }
  }
  return best;
}

namespace {

bool contains(std::span<const std::string> keys, std::string_view key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

Candidate candidate_of(const Instance& i) {
  return Candidate{i.key, i.liveness->outstanding.load(std::memory_order_relaxed),
                   std::max<uint32_t>(1, i.dp_size), {}};
}

// The ledger's node totals and estimates, for a policy that reads them (Policy::needs_load).
CandidateLoad load_of(const Instance& i, std::chrono::steady_clock::time_point now) {
  const discovery::LoadLedger& ledger = i.liveness->ledger;
  CandidateLoad load;
  discovery::LoadFigures figures;
  // DP ranks: the figures of the rank the next leg goes to (next_dp_rank turns them in order; a
  // concurrent pick on another worker may take it first, which the next pick then sees).
  const uint32_t next = i.dp_size > 1 ? static_cast<uint32_t>(
                                            i.liveness->next_dp_rank.load(std::memory_order_relaxed) % i.dp_size)
                                      : 0;
  if (i.dp_size > 1 && next < ledger.rank_slots()) {
    figures = ledger.rank(next);
    load.of_next_rank = true;
  } else {
    figures = ledger.totals();
  }
  load.queued_prefill_tokens = figures.queued_prefill_tokens;
  load.decode_sequences = figures.decode_sequences;
  load.kv_tokens = figures.kv_tokens;
  load.prefill_tokens_per_second = ledger.prefill_tokens_per_second.read(now).value;
  load.decode_step_seconds = ledger.decode_step_seconds.read(now).value;
  // The node's own figures, when the load scrape read them recently: what other clients put on
  // it, and its real KV use. Stale or never read: the ledger alone.
  const discovery::EngineLoad engine = discovery::engine_load(i, now);
  if (engine.present) {
    const discovery::MergedLoad merged = discovery::merge_load(discovery::node_load(*i.liveness), engine);
    load.other_requests = merged.other_requests;
    load.kv_cache_usage = merged.kv_cache_usage;
  }
  return load;
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

// Per-thread scratch of choose_pair / choose_decode (a worker calls them per request, never
// nested): cleared and refilled, so choosing a pair allocates nothing once they have grown.
struct PairScratch {
  std::vector<const InstancePtr*> members;  // the candidates of every class, one range each
  struct Class {
    size_t decodes_begin, prefills_begin, prefills_end;  // decodes end where prefills begin
  };
  std::vector<Class> classes;
  std::vector<const InstancePtr*> pool;  // what a policy picks from
  std::vector<Candidate> candidates;
};

PairScratch& pair_scratch() {
  thread_local PairScratch s;
  s.members.clear();
  s.classes.clear();
  s.pool.clear();
  return s;
}

// The class holding the query's preferred decode when it is a usable candidate (not ejected);
// null otherwise.
const PairScratch::Class* preferred_class(const PairScratch& sc, const PairQuery& q) {
  if (q.preferred_decode.empty()) return nullptr;
  for (const PairScratch::Class& c : sc.classes) {
    for (size_t i = c.decodes_begin; i < c.prefills_begin; ++i) {
      const Instance& d = **sc.members[i];
      if (d.key != q.preferred_decode) continue;
      if (q.now != discovery::Clock::time_point{} && ejected(*d.liveness, q.now)) return nullptr;
      return &c;
    }
  }
  return nullptr;
}

const InstancePtr* pick(std::vector<const InstancePtr*>& pool, Policy& policy, const RequestSummary& summary,
                        std::vector<Candidate>& candidates) {
  candidates.clear();
  for (const InstancePtr* i : pool) candidates.push_back(candidate_of(**i));
  if (policy.needs_load()) {
    const auto now = std::chrono::steady_clock::now();
    for (size_t n = 0; n < pool.size(); ++n) candidates[n].load = load_of(**pool[n], now);
  }
  const size_t index = policy.pick(candidates, summary);
  return pool[std::min(index, pool.size() - 1)];
}

// `preferred` (an element of `pool`) is used instead of the policy's pick. A policy that explains
// its choices (predicted_latency, when the request has an explanation) still predicts every
// candidate of `leg`, and the explanation names the preferred node as chosen: its prediction is
// what the SLO check and GET /debug/route then read, as for a pick of the policy's own. With
// `margin_seconds` at least 0, a preferred node predicted slower than the fastest candidate by
// more than that is passed over for the policy's pick (*spilled set): stickiness is worth some
// queueing, and the prediction already credits the node with the prompt it holds, so only a
// queue that costs more than the margin beyond the best moves the request.
const InstancePtr* use_preferred(std::vector<const InstancePtr*>& pool, const InstancePtr* preferred, Policy& policy,
                                 const RequestSummary& summary, std::vector<Candidate>& candidates, PolicyLeg leg,
                                 double margin_seconds = -1, bool* spilled = nullptr) {
  if (summary.explain == nullptr || !policy.needs_load()) return preferred;
  const InstancePtr* own = pick(pool, policy, summary, candidates);
  LegExplanation& e = leg == PolicyLeg::kPrefill ? summary.explain->prefill : summary.explain->decode;
  if (!e.filled) return preferred;
  const size_t rows = std::min(pool.size(), e.rows.size());
  size_t mine = rows;
  double fastest = 0;
  for (size_t n = 0; n < rows; ++n) {
    if (pool[n] == preferred) mine = n;
    if (n == 0 || e.rows[n].predicted_seconds < fastest) fastest = e.rows[n].predicted_seconds;
  }
  if (mine == rows) return preferred;
  if (margin_seconds >= 0 && own != preferred && e.rows[mine].predicted_seconds > fastest + margin_seconds) {
    if (spilled != nullptr) *spilled = true;
    return own;  // the explanation keeps the policy's own choice
  }
  e.chosen = mine;
  e.preferred = true;
  return preferred;
}

// The query's preferred prefill when it is in `pool` (and not spilled by its margin), else the
// policy's pick.
const InstancePtr* pick_prefill(std::vector<const InstancePtr*>& pool, Policy& policy, const PairQuery& q,
                                std::vector<Candidate>& candidates, bool* spilled) {
  if (!q.preferred_prefill.empty()) {
    for (const InstancePtr* i : pool) {
      if ((*i)->key == q.preferred_prefill) {
        return use_preferred(pool, i, policy, q.summary, candidates, PolicyLeg::kPrefill,
                             q.preferred_prefill_margin_seconds, spilled);
      }
    }
  }
  return pick(pool, policy, q.summary, candidates);
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

// Appends the members of `group` serving the query's model and not excluded to *out; returns
// how many.
size_t add_candidates(const discovery::RoutableGroup& group, std::string_view model,
                      std::span<const std::string> excluded, size_t* visited, std::vector<const InstancePtr*>* out) {
  const size_t begin = out->size();
  group.serving(model, out);
  if (visited != nullptr) *visited += out->size() - begin;
  if (!excluded.empty()) {
    out->erase(std::remove_if(out->begin() + static_cast<std::ptrdiff_t>(begin), out->end(),
                              [&](const InstancePtr* i) { return contains(excluded, (*i)->key); }),
               out->end());
  }
  return out->size() - begin;
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
  out->prefill_spilled = false;
  discovery::RoutableIndex local;
  const discovery::RoutableIndex& index = index_of(s, &local);
  // Per compatibility class with both sides present: its usable decodes, then its usable prefills.
  PairScratch& sc = pair_scratch();
  for (const discovery::RoutableGroup& pg : index.groups) {
    if (pg.role != Role::kPrefill || !pairable_class(pg)) continue;
    const discovery::RoutableGroup* dg = index.find(Role::kDecode, pg.connector, pg.transfer_mode);
    if (dg == nullptr) continue;
    const size_t decodes_begin = sc.members.size();
    if (add_candidates(*dg, q.model, q.excluded_decodes, q.visited, &sc.members) == 0) continue;
    const size_t prefills_begin = sc.members.size();
    if (add_candidates(pg, q.model, q.excluded_prefills, q.visited, &sc.members) == 0) {
      sc.members.resize(decodes_begin);
      continue;
    }
    sc.classes.push_back({decodes_begin, prefills_begin, sc.members.size()});
  }
  if (sc.classes.empty()) return no_pair_reason(s, q);
  auto range = [&sc](size_t begin, size_t end) {
    return std::span<const InstancePtr* const>(sc.members.data() + begin, end - begin);
  };
  // Key order across classes, as one scan of the snapshot gave (policies index into this list).
  for (const PairScratch::Class& c : sc.classes) {
    const auto prefills = range(c.prefills_begin, c.prefills_end);
    sc.pool.insert(sc.pool.end(), prefills.begin(), prefills.end());
  }
  if (sc.classes.size() > 1) {
    std::sort(sc.pool.begin(), sc.pool.end(),
              [](const InstancePtr* a, const InstancePtr* b) { return (*a)->key < (*b)->key; });
  }
  if (const PairScratch::Class* c = preferred_class(sc, q)) {
    // The preferred decode's class only: its prefills, and that decode.
    sc.pool.clear();
    const auto prefills = range(c->prefills_begin, c->prefills_end);
    sc.pool.assign(prefills.begin(), prefills.end());
    prefer_not_ejected(sc.pool, q.now);
    out->prefill = *pick_prefill(sc.pool, prefill_policy, q, sc.candidates, &out->prefill_spilled);
    sc.pool.clear();
    const InstancePtr* preferred = nullptr;
    for (size_t i = c->decodes_begin; i < c->prefills_begin; ++i) {
      if (!compatible(*out->prefill, **sc.members[i])) continue;
      sc.pool.push_back(sc.members[i]);
      if ((*sc.members[i])->key == q.preferred_decode) preferred = sc.members[i];
    }
    prefer_not_ejected(sc.pool, q.now);
    out->decode = preferred != nullptr
                      ? *use_preferred(sc.pool, preferred, decode_policy, q.summary, sc.candidates, PolicyLeg::kDecode)
                      : *pick(sc.pool, decode_policy, q.summary, sc.candidates);
    return Status::ok();
  }
  prefer_not_ejected(sc.pool, q.now);
  const InstancePtr* prefill = pick_prefill(sc.pool, prefill_policy, q, sc.candidates, &out->prefill_spilled);
  sc.pool.clear();
  for (const PairScratch::Class& c : sc.classes) {
    if (compatible(**prefill, **sc.members[c.decodes_begin])) {
      const auto decodes = range(c.decodes_begin, c.prefills_begin);
      sc.pool.assign(decodes.begin(), decodes.end());
      break;
    }
  }
  prefer_not_ejected(sc.pool, q.now);
  out->prefill = *prefill;
  out->decode = *pick(sc.pool, decode_policy, q.summary, sc.candidates);
  return Status::ok();
}

Status choose_decode(const RegistrySnapshot& s, const Instance& prefill, const PairQuery& q, Policy& decode_policy,
                     InstancePtr* out) {
  discovery::RoutableIndex local;
  const discovery::RoutableIndex& index = index_of(s, &local);
  PairScratch& sc = pair_scratch();
  const proto::TransferMode mode = proto::pairing_mode(prefill.connector, prefill.transfer_mode);
  if (const discovery::RoutableGroup* dg = index.find(Role::kDecode, prefill.connector, mode)) {
    add_candidates(*dg, q.model, q.excluded_decodes, q.visited, &sc.pool);
    std::erase_if(sc.pool, [&](const InstancePtr* d) { return !compatible(prefill, **d); });
  }
  if (sc.pool.empty()) {
    return Status(StatusCode::kNotFound, "no other decode instance compatible with prefill " + prefill.key);
  }
  prefer_not_ejected(sc.pool, q.now);
  *out = *pick(sc.pool, decode_policy, q.summary, sc.candidates);
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

bool serves_capability(const proto::Labels& labels, std::string_view capability) {
  for (const auto& [key, value] : labels) {
    if (key != kServesLabel) continue;
    std::string_view list = value;
    while (!list.empty()) {
      const size_t comma = list.find(',');
      std::string_view item = list.substr(0, comma);
      while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
      while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
      if (item == capability) return true;
      if (comma == std::string_view::npos) break;
      list.remove_prefix(comma + 1);
    }
  }
  return false;
}

}  // namespace pdr::router::routing
