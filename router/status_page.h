// GET /status: the live registry as JSON for operators and tests. Pure rendering; no I/O.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "discovery/instance.h"
#include "router/cache/kv_events_subscriber.h"
#include "router/proxy/admission_queue_counters.h"

namespace pdr::router {

struct StatusContext {
  std::string http_listener;        // "0.0.0.0:10001"
  std::string discovery_listener;   // bound ZMQ endpoint
  std::string topology_path;        // "" when running on defaults
  uint64_t topology_reloads_ok = 0;
  uint64_t topology_reloads_failed = 0;
  std::string topology_last_error;  // "" when the last reload succeeded
  int64_t uptime_ms = 0;
  uint32_t workers = 0;
  std::string discovery_curve_listener;  // "" when there is no CURVE endpoint
  bool discovery_open = false;
  std::array<uint32_t, config::kAdmissionClasses> class_caps{};  // max_instances_per_class
  // The KV events subscriber's per-node counters, sorted by node (kv_events.enabled), else null.
  const std::vector<cache::KvEventsNodeStats>* kv_events = nullptr;
  // /status "registry_backend": {"backend": "memory"} or, with etcd, also etcd_reachable,
  // replica_id, replica_entries (nodes learnt from other replicas), last_error, bad_entries and
  // last_bad_entry (key-values under the prefix refused one by one: bad data, not unreachability),
  // and conversation_entries {local, mirrored} (multi-turn entries, conversation_mirror.h).
  struct RegistryBackend {
    std::string backend = "memory";
    bool etcd_reachable = false;
    std::string replica_id;
    uint64_t replica_entries = 0;
    std::string last_error;
    uint64_t bad_entries = 0;
    std::string last_bad_entry;
    // Multi-turn entries held: stored here, and mirrored from other replicas (etcd only).
    uint64_t conversation_entries_local = 0;
    uint64_t conversation_entries_mirrored = 0;
  } registry_backend;
  // /status "kubernetes": {"enabled": false} or, with pod discovery, also api_server, namespace,
  // label_selector, prefill_selector and decode_selector (null unless set), state (listing, watching, retrying), watching, resource_version, pods (pods
  // that are registry entries) and last_error.
  struct Kubernetes {
    bool enabled = false;
    std::string api_server;
    std::string namespace_name;
    std::string label_selector;
    std::string prefill_selector;  // "" (null in the JSON) unless pod roles come from selectors
    std::string decode_selector;
    std::string state;
    bool watching = false;
    std::string resource_version;
    uint64_t pods = 0;
    std::string last_error;
  } kubernetes;
  // /status "admission_queue" (router/proxy/admission_queue.h): the slots (in_flight,
  // max_concurrent_requests), the waiters (waiting, bytes, by_priority: depth per class from 0)
  // and the queue's limits (enabled false: a limit is 0, requests are refused at once).
  struct AdmissionQueue {
    bool enabled = false;
    int64_t in_flight = 0;
    uint64_t max_concurrent_requests = 0;
    uint64_t bytes = 0;
    std::array<uint32_t, proxy::kPriorityClasses> by_priority{};
    uint64_t max_queued_requests = 0;
    uint64_t max_queued_bytes = 0;
    int64_t queue_timeout_ms = 0;
  } admission_queue;
  // /status "session_affinity" (router/routing/session_affinity.h): enabled, sessions (bindings
  // held, local and mirrored) and the turn counters hits, misses, spills, broken, rebinds, bad_ids.
  struct SessionAffinity {
    bool enabled = false;
    uint64_t sessions = 0, hits = 0, misses = 0, spills = 0, broken = 0, rebinds = 0, bad_ids = 0;
  } session_affinity;
};

// {"version", "uptime_ms", "listeners", "topology", "registry_version", "counts":{role:{state:n}},
//  "instances":[{role, http_address, dialect, registration_format, transfer_mode, zmq_address,
//  dp_size, tp_size, bootstrap_port, model, labels, load, state, operator_drain, source,
//  instance_id, epoch, first_seen_ms_ago, last_seen_ms_ago, expires_in_ms, ttl_ms, messages,
//  restarts, kv_events_endpoint, kv_events_replay_endpoint, kv_events_ports,
//  kv_events_replay_ports, kv_events}]}
// kv_events_endpoint / kv_events_replay_endpoint: what the node (or operator) named, "tcp://..."
// or null; kv_events_ports / kv_events_replay_ports: each DP rank's port when the node listed
// them ([] otherwise: rank r at port + r). kv_events (present only with kv_events.enabled; null
// for a node not subscribed to): {endpoint, replay_endpoint, wanted_ranks, subscribed_ranks,
// ranks_seen, blocks_indexed, batches, events, gaps, replays, replay_failures, decode_errors,
// bad_messages, publisher_restarts, node_restarts, rate_limited, ranks_over_cap}.
// `dialect` is the KV connector dialect ("moriio", "p2p-nccl", ...); registration_format is the
// wire shape the node registered with. Times are relative to `now` (steady clock);
// last_seen_ms_ago is null for an instance never heard from (static, no heartbeat yet) and
// expires_in_ms is null when the instance cannot expire (static/admin) or already has.
std::string render_status_json(const discovery::RegistrySnapshot& snapshot,
                               discovery::Clock::time_point now, const StatusContext& context);

// The admin API's views, with the same per-instance object as /status:
// one instance, and {"registry_version", "instances":[...]}.
std::string render_instance_json(const discovery::Instance& inst, discovery::Clock::time_point now);
std::string render_instances_json(const discovery::RegistrySnapshot& snapshot,
                                  discovery::Clock::time_point now);

}  // namespace pdr::router
