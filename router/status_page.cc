#include "router/status_page.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "discovery/load_charge.h"
#include "router/routing/ejection.h"

namespace pdr::router {
namespace {

using discovery::Clock;
using discovery::Instance;
using discovery::InstanceState;

int64_t ms_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

// How the entry's node proved who it is: its admission class when a node registered it, here or
// (replica entries) on the replica that owns it; "operator" for static, admin and Kubernetes
// entries and for replica entries that are static or admin on their owner.
std::string admission_name(const Instance& inst) {
  switch (inst.source) {
    case discovery::InstanceSource::kRegistered: return std::string(config::to_string(inst.admission));
    case discovery::InstanceSource::kReplica:
      return std::string(
          discovery::to_string(discovery::ReplicaOrigin{inst.admission, inst.replica_of_operator_entry}));
    default: return "operator";
  }
}

nlohmann::json load_figures_json(const discovery::LoadFigures& f) {
  return {{"requests", f.requests},
          {"prefill_tokens_queued", f.queued_prefill_tokens},
          {"decode_sequences", f.decode_sequences},
          {"kv_tokens", f.kv_tokens}};
}

// A rate estimate: its value in `scale` units (null before the first sample), samples, age.
nlohmann::json estimate_json(const discovery::RateEstimate& e, double scale, Clock::time_point now) {
  const discovery::RateEstimate::Reading r = e.read(now);
  return {{"value", r.present() ? nlohmann::json(r.value * scale) : nlohmann::json()},
          {"samples", r.samples},
          {"age_ms", r.present() ? nlohmann::json(std::chrono::duration_cast<std::chrono::milliseconds>(r.age).count())
                                 : nlohmann::json()}};
}

// What pdrouter has put on the node (discovery/load_ledger.h): totals, each DP rank (index =
// rank, up to discovery::kMaxLedgerRanks), the ranks beyond those together, the rate estimates.
nlohmann::json router_load_json(const Instance& inst, Clock::time_point now) {
  const discovery::InstanceLiveness& live = *inst.liveness;
  nlohmann::json j = load_figures_json(discovery::node_load(live));
  const uint32_t shown = std::max(live.ledger.rank_slots(),
                                  std::clamp<uint32_t>(inst.dp_size, 1, discovery::kMaxLedgerRanks));
  nlohmann::json ranks = nlohmann::json::array();
  for (uint32_t r = 0; r < shown; ++r) ranks.push_back(load_figures_json(live.ledger.rank(r)));
  j["ranks"] = std::move(ranks);
  j["ranks_beyond"] = load_figures_json(live.ledger.beyond());
  j["prefill_tokens_per_second"] = estimate_json(live.ledger.prefill_tokens_per_second, 1, now);
  j["decode_step_ms"] = estimate_json(live.ledger.decode_step_seconds, 1000, now);
  return j;
}

nlohmann::json engine_figures_json(const proto::EngineLoadFigures& f) {
  return {{"running", f.running},
          {"waiting", f.waiting},
          {"kv_cache_usage", f.kv_cache_usage >= 0 ? nlohmann::json(f.kv_cache_usage) : nlohmann::json()}};
}

// What the load scrape last read of the node (discovery/engine_load.h): its figures while fresh
// (null otherwise), per DP rank when the page had engine labels, the age of the last read, the
// last failure; null when the node was never tried.
nlohmann::json engine_load_json(const Instance& inst, Clock::time_point now) {
  const discovery::EngineLoadCell& cell = inst.liveness->engine_load;
  const discovery::EngineScrapeState state = cell.state();
  if (state.reads == 0 && state.failures == 0) return nlohmann::json();
  const discovery::EngineLoad load = cell.node(now);
  nlohmann::json j = {{"reads", state.reads}, {"failures", state.failures}};
  j["age_ms"] = state.reads == 0 ? nlohmann::json()
                                 : nlohmann::json(std::chrono::duration_cast<std::chrono::milliseconds>(load.age).count());
  j["figures"] = load.present ? engine_figures_json(load.figures) : nlohmann::json();
  nlohmann::json ranks = nlohmann::json::array();
  if (load.present) {
    for (uint32_t r = 0; r < std::min(load.ranks, discovery::kMaxEngineLoadRanks); ++r) {
      const discovery::EngineLoad rank = cell.rank(r, now);
      ranks.push_back(rank.present ? engine_figures_json(rank.figures) : nlohmann::json());
    }
  }
  j["ranks"] = std::move(ranks);
  j["last_error"] = state.last_failure == discovery::EngineScrapeFailure::kNone
                        ? nlohmann::json()
                        : nlohmann::json(discovery::to_string(state.last_failure));
  j["last_error_ms_ago"] = state.failures == 0 ? nlohmann::json() : nlohmann::json(ms_between(state.last_failure_at, now));
  return j;
}

nlohmann::json instance_json(const Instance& inst, Clock::time_point now) {
  nlohmann::json j = {
      {"role", proto::to_string(inst.role)},
      {"http_address", inst.key},
      // A node without a KV connector (never paired) shows "none", as the operator declares it.
      {"dialect", inst.connector == proto::Connector::kUnknown ? std::string_view("none")
                                                                 : proto::to_string(inst.connector)},
      {"registration_format", proto::to_string(inst.format)},
      {"transfer_mode", proto::to_string(inst.transfer_mode)},
      {"zmq_address", inst.zmq_address},
      {"dp_size", inst.dp_size},
      {"tp_size", inst.tp_size},
      {"model", inst.model},
      {"state", discovery::to_string(inst.state)},
      {"operator_drain", inst.operator_drain},
      {"source", discovery::to_string(inst.source)},
      {"admission", admission_name(inst)},
      {"instance_id", inst.instance_id},
      {"epoch", inst.epoch},
      {"first_seen_ms_ago", ms_between(inst.first_seen, now)},
      {"ttl_ms", inst.ttl.count()},
      {"messages", inst.messages()},
      {"restarts", inst.restarts},
  };
  // null: never heard from (a static instance that does not heartbeat).
  j["last_seen_ms_ago"] = inst.messages() == 0 ? nlohmann::json() : nlohmann::json(ms_between(inst.last_seen(), now));
  j["bootstrap_port"] = inst.bootstrap_port ? nlohmann::json(*inst.bootstrap_port) : nlohmann::json();
  j["engine_id"] = inst.engine_id;
  j["pp_size"] = inst.pp_size;
  j["kv_events_endpoint"] = inst.kv_events_endpoint
                                ? nlohmann::json(proto::zmq_tcp_endpoint(*inst.kv_events_endpoint))
                                : nlohmann::json();
  j["kv_events_replay_endpoint"] =
      inst.kv_events_replay_endpoint
          ? nlohmann::json(proto::zmq_tcp_endpoint(*inst.kv_events_replay_endpoint))
          : nlohmann::json();
  j["kv_events_ports"] = inst.kv_events_ports;
  j["kv_events_replay_ports"] = inst.kv_events_replay_ports;
  const Clock::time_point expires_at = inst.expires_at();
  j["expires_in_ms"] = expires_at == Clock::time_point::max() || inst.state == InstanceState::kExpired
                           ? nlohmann::json()
                           : nlohmann::json(ms_between(now, expires_at));
  // Passive health (router/routing/ejection.h).
  j["connect_failures"] = inst.liveness->connect_failures.load(std::memory_order_relaxed);
  j["ejected_for_ms"] = routing::ejected_for(*inst.liveness, now).count();
  j["router_load"] = router_load_json(inst, now);
  j["engine_load"] = engine_load_json(inst, now);
  nlohmann::json labels = nlohmann::json::object();
  for (const auto& [k, v] : inst.labels) labels[k] = v;
  j["labels"] = std::move(labels);
  const proto::NodeLoad load = inst.load();
  j["load"] = load.present ? nlohmann::json{{"running", load.running},
                                            {"waiting", load.waiting},
                                            {"free_kv_blocks", load.free_kv_blocks}}
                           : nlohmann::json();
  return j;
}

nlohmann::json instances_json(const discovery::RegistrySnapshot& snapshot, Clock::time_point now) {
  nlohmann::json instances = nlohmann::json::array();
  for (const auto& inst : snapshot.instances) instances.push_back(instance_json(*inst, now));
  return instances;
}

nlohmann::json kv_events_json(const cache::KvEventsNodeStats& s) {
  return {{"endpoint", s.endpoint},
          {"replay_endpoint", s.replay_endpoint.empty() ? nlohmann::json() : nlohmann::json(s.replay_endpoint)},
          {"wanted_ranks", s.wanted_ranks},
          {"subscribed_ranks", s.subscribed_ranks},
          {"ranks_seen", s.ranks_seen},
          {"blocks_indexed", s.blocks_indexed},
          {"batches", s.batches},
          {"events", s.events},
          {"gaps", s.gaps},
          {"replays", s.replays},
          {"replay_failures", s.replay_failures},
          {"decode_errors", s.decode_errors},
          {"bad_messages", s.bad_messages},
          {"publisher_restarts", s.publisher_restarts},
          {"node_restarts", s.node_restarts},
          {"rate_limited", s.rate_limited},
          {"ranks_over_cap", s.ranks_over_cap}};
}

// Adds each instance's "kv_events" object (null for a node not subscribed to).
void add_kv_events(const discovery::RegistrySnapshot& snapshot,
                   const std::vector<cache::KvEventsNodeStats>& stats, nlohmann::json* instances) {
  for (size_t i = 0; i < snapshot.instances.size(); ++i) {
    const std::string& key = snapshot.instances[i]->key;
    auto it = std::lower_bound(stats.begin(), stats.end(), key,
                               [](const cache::KvEventsNodeStats& s, const std::string& k) { return s.node < k; });
    (*instances)[i]["kv_events"] =
        it != stats.end() && it->node == key ? kv_events_json(*it) : nlohmann::json();
  }
}

// Replace invalid UTF-8 rather than throw: node-supplied strings are untrusted.
std::string dump(const nlohmann::json& doc) { return doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

nlohmann::json admission_queue_json(const StatusContext::AdmissionQueue& q) {
  uint64_t waiting = 0;
  for (uint32_t n : q.by_priority) waiting += n;
  return {{"enabled", q.enabled},
          {"in_flight", q.in_flight},
          {"max_concurrent_requests", q.max_concurrent_requests},
          {"waiting", waiting},
          {"bytes", q.bytes},
          {"by_priority", q.by_priority},
          {"max_queued_requests", q.max_queued_requests},
          {"max_queued_bytes", q.max_queued_bytes},
          {"queue_timeout_ms", q.queue_timeout_ms}};
}

// Registered entries and caps per admission class: {"address": {"instances": n, "max": m}, ...}.
nlohmann::json admission_json(const discovery::RegistrySnapshot& snapshot, const StatusContext& context) {
  nlohmann::json by_class = nlohmann::json::object();
  for (size_t c = 0; c < config::kAdmissionClasses; ++c) {
    by_class[std::string(config::to_string(static_cast<config::AdmissionClass>(c)))] = {
        {"instances", snapshot.count_by_class[c]}, {"max", context.class_caps[c]}};
  }
  return by_class;
}

}  // namespace

std::string render_instance_json(const Instance& inst, Clock::time_point now) { return dump(instance_json(inst, now)); }

std::string render_instances_json(const discovery::RegistrySnapshot& snapshot, Clock::time_point now) {
  return dump({{"registry_version", snapshot.version}, {"instances", instances_json(snapshot, now)}});
}

namespace {
nlohmann::json registry_backend_json(const StatusContext::RegistryBackend& b) {
  if (b.backend != "etcd") return {{"backend", b.backend}};
  return {{"backend", b.backend},
          {"etcd_reachable", b.etcd_reachable},
          {"replica_id", b.replica_id},
          {"replica_entries", b.replica_entries},
          {"last_error", b.last_error},
          {"bad_entries", b.bad_entries},
          {"last_bad_entry", b.last_bad_entry},
          {"conversation_entries",
           {{"local", b.conversation_entries_local}, {"mirrored", b.conversation_entries_mirrored}}}};
}
nlohmann::json kubernetes_json(const StatusContext::Kubernetes& k) {
  if (!k.enabled) return {{"enabled", false}};
  return {{"enabled", true},
          {"api_server", k.api_server},
          {"namespace", k.namespace_name},
          {"label_selector", k.label_selector},
          {"prefill_selector", k.prefill_selector.empty() ? nlohmann::json() : nlohmann::json(k.prefill_selector)},
          {"decode_selector", k.decode_selector.empty() ? nlohmann::json() : nlohmann::json(k.decode_selector)},
          {"state", k.state},
          {"watching", k.watching},
          {"resource_version", k.resource_version},
          {"pods", k.pods},
          {"last_error", k.last_error}};
}
}  // namespace

std::string render_status_json(const discovery::RegistrySnapshot& snapshot, Clock::time_point now,
                               const StatusContext& context) {
  nlohmann::json counts = nlohmann::json::object();
  for (proto::Role role : {proto::Role::kPrefill, proto::Role::kDecode}) {
    nlohmann::json by_state = nlohmann::json::object();
    for (InstanceState state : {InstanceState::kUp, InstanceState::kDraining, InstanceState::kExpired}) {
      by_state[std::string(discovery::to_string(state))] = snapshot.count(role, state);
    }
    counts[std::string(proto::to_string(role))] = std::move(by_state);
  }
  nlohmann::json instances = instances_json(snapshot, now);
  if (context.kv_events != nullptr) add_kv_events(snapshot, *context.kv_events, &instances);
  nlohmann::json doc = {
      {"version", PDR_VERSION},
      {"uptime_ms", context.uptime_ms},
      {"workers", context.workers},
      {"listeners",
       {{"http", context.http_listener},
        {"discovery", context.discovery_listener},
        {"discovery_curve", context.discovery_curve_listener}}},
      {"discovery_open", context.discovery_open},
      {"admission", admission_json(snapshot, context)},
      {"topology",
       {{"path", context.topology_path},
        {"reloads_ok", context.topology_reloads_ok},
        {"reloads_failed", context.topology_reloads_failed},
        {"last_error", context.topology_last_error}}},
      {"registry_version", snapshot.version},
      {"registry_backend", registry_backend_json(context.registry_backend)},
      {"kubernetes", kubernetes_json(context.kubernetes)},
      {"admission_queue", admission_queue_json(context.admission_queue)},
      {"session_affinity",
       {{"enabled", context.session_affinity.enabled},
        {"sessions", context.session_affinity.sessions},
        {"hits", context.session_affinity.hits},
        {"misses", context.session_affinity.misses},
        {"spills", context.session_affinity.spills},
        {"broken", context.session_affinity.broken},
        {"rebinds", context.session_affinity.rebinds},
        {"bad_ids", context.session_affinity.bad_ids}}},
      {"counts", std::move(counts)},
      {"instances", std::move(instances)},
  };
  return dump(doc);
}

}  // namespace pdr::router
