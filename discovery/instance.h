// One prefill or decode node as the registry knows it, and the immutable snapshot readers get.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "discovery/config/admission.h"
#include "discovery/engine_load.h"
#include "discovery/load_ledger.h"
#include "proto/discovery_message.h"
#include "proto/node_spec.h"

namespace pdr::discovery {

using Clock = std::chrono::steady_clock;

enum class InstanceState : uint8_t { kUp, kDraining, kExpired };
// kReplica: learnt from another pdrouter replica through the shared registry (registry.backend:
// etcd, discovery/sources/etcd/registry_replicator.h); that replica's etcd lease, not a local TTL, ends it.
// kKubernetes: a pod found by Kubernetes pod discovery (discovery/sources/kubernetes/pod_watcher.h); the pod's
// deletion or loss of readiness, not a local TTL, ends it. Every replica watches the API itself.
enum class InstanceSource : uint8_t { kRegistered, kStatic, kAdmin, kReplica, kKubernetes };

std::string_view to_string(InstanceState);   // "up", "draining", "expired"
std::string_view to_string(InstanceSource);  // "registered", "static", "admin", "replica", "kubernetes"

// How strongly a replica entry's node proved who it is, on the replica that owns the entry: the
// admission class it registered with there, or `operator_entry` for a static or admin entry there
// (the operator's word, above every class). Registry::upsert_replica takes it; a sender here may
// change the entry only from at least that rank (Registry::upsert).
struct ReplicaOrigin {
  config::AdmissionClass admission = config::AdmissionClass::kOpen;  // the weakest: nothing proven
  bool operator_entry = false;
  friend bool operator==(const ReplicaOrigin&, const ReplicaOrigin&) = default;
};
// "open", "address", "token", "curve", or "operator": how /status and the etcd value name it.
std::string_view to_string(const ReplicaOrigin&);
// The inverse; an absent (empty) or unknown name is the weakest class, never a stronger one: a
// value written by an older replica, or by anyone with write access to etcd, proves nothing.
ReplicaOrigin parse_replica_origin(std::string_view name);

// What changes with every heartbeat. One cell per registered node, shared by every copy of its
// Instance across snapshots, so a heartbeat that changes nothing else costs a few atomic stores
// and no snapshot. Written only by the discovery thread; read by anyone (relaxed: each field is
// independently meaningful, and readers tolerate a value one heartbeat old).
struct InstanceLiveness {
  std::atomic<int64_t> last_seen_ns{0};   // Clock::time_point::time_since_epoch() in ns
  std::atomic<int64_t> expires_at_ns{0};  // INT64_MAX: never
  std::atomic<uint64_t> messages{0};
  std::atomic<bool> load_present{false};
  std::atomic<uint32_t> running{0};
  std::atomic<uint32_t> waiting{0};
  std::atomic<uint64_t> free_kv_blocks{0};
  // The one field written by the HTTP workers, not the discovery thread: requests pdrouter has
  // in flight on this node (charged when a leg is assigned, given back when the request ends),
  // summed over all workers; least_outstanding and power_of_two read it. Changed only through
  // LoadCharge handles (load_charge.h), of which it is the node's total of requests.
  std::atomic<uint32_t> outstanding{0};
  // The rest of what pdrouter has put on the node, per DP rank too (load_ledger.h), also written
  // by the workers through LoadCharge handles.
  LoadLedger ledger;
  // What the node reports of its own load (its /metrics page), as the periodic scrape last read
  // it, with its time (engine_load.h; written by the one worker that runs the scrape).
  EngineLoadCell engine_load;
  // Also written by the workers (router/routing/ejection.h): legs in a row that could not connect
  // to this node, and until when pairing skips it because of them (ns as last_seen_ns; 0: not).
  std::atomic<uint32_t> connect_failures{0};
  std::atomic<int64_t> ejected_until_ns{0};
  // And the next DP rank a leg to this node is pinned to (router/routing/pairing.h next_dp_rank).
  std::atomic<uint32_t> next_dp_rank{0};

  Clock::time_point last_seen() const;
  Clock::time_point expires_at() const;
  proto::NodeLoad load() const;
  void set_last_seen(Clock::time_point t);
  void set_expires_at(Clock::time_point t);  // Clock::time_point::max() for never
  void set_load(const proto::NodeLoad& load);
};

// The node's description (NodeSpec: the registration's, or for static and admin entries the
// operator's, with zmq_address parsed) plus what the registry knows of it.
struct Instance : proto::NodeSpec {
  std::string key;  // canonical http_address ("host:port" / "[v6]:port"); unique in a snapshot
  proto::RegistrationFormat format = proto::RegistrationFormat::kStatic;
  std::string instance_id;  // the node's, from its pdrouter registrations ("" otherwise)
  uint64_t epoch = 0;

  // kDraining when the node says so (node_draining, from its heartbeats) or an operator drained
  // it (operator_drain, admin API; kept across heartbeats, restarts and reloads, cleared only by
  // an undrain or the entry's removal); kExpired wins over both.
  InstanceState state = InstanceState::kUp;
  bool node_draining = false;
  bool operator_drain = false;
  InstanceSource source = InstanceSource::kRegistered;
  // How the node that created (or last took over) a registered entry was admitted; for a replica
  // entry, how it was admitted on the replica that owns it (published with the entry). Meaningless
  // for static and admin entries, which the operator owns, and for a replica entry whose owner
  // holds it as a static or admin one (replica_of_operator_entry).
  config::AdmissionClass admission = config::AdmissionClass::kAddress;
  bool replica_of_operator_entry = false;
  Clock::time_point first_seen{};
  std::chrono::milliseconds ttl{0};  // 0 for static/admin
  uint64_t restarts = 0;             // epoch changes seen
  // Never null for instances the registry hands out. Liveness is live: an old snapshot's
  // Instance shows the newest last_seen/load of that node.
  std::shared_ptr<InstanceLiveness> liveness = std::make_shared<InstanceLiveness>();

  // Every field, liveness by identity: two copies of one registry entry compare equal exactly
  // when nothing /status shows or routing reads differs, apart from the live counters.
  friend bool operator==(const Instance&, const Instance&) = default;

  Clock::time_point last_seen() const { return liveness->last_seen(); }
  Clock::time_point expires_at() const { return liveness->expires_at(); }
  uint64_t messages() const { return liveness->messages.load(std::memory_order_relaxed); }
  proto::NodeLoad load() const { return liveness->load(); }
};

// Pairing's view of a snapshot (router/routing/pairing.h): the routable instances (state up, known
// connector) grouped by role and compatibility class: the connector, and for MoRIIO the transfer
// mode (other connectors' groups have TransferMode::kNone). Each group is in key order and split
// by declared model. Built once per snapshot, so choosing a pair visits the candidates of the
// compatible groups only, not every entry (a registry full of incompatible entries must not slow pairing). Routable means state kUp
// when the snapshot was taken; ejection (live) is left to pairing.
struct RoutableGroup {
  proto::Role role = proto::Role::kPrefill;
  proto::Connector connector = proto::Connector::kUnknown;
  proto::TransferMode transfer_mode = proto::TransferMode::kNone;
  std::vector<std::shared_ptr<const Instance>> all;        // every member, key order
  std::vector<std::shared_ptr<const Instance>> any_model;  // members that declared no model
  std::map<std::string, std::vector<std::shared_ptr<const Instance>>, std::less<>>
      by_model;  // declared model -> members
  // Appends the members serving `model` ("" = any request) to *out, in key order: all, or
  // any_model merged with by_model[model]. (An out-parameter: pairing reuses one per thread.)
  void serving(std::string_view model, std::vector<const std::shared_ptr<const Instance>*>* out) const;
};

struct RoutableIndex {
  bool built = false;  // false: a hand-made snapshot (tests); pairing builds one on the fly
  std::vector<RoutableGroup> groups;

  // `instances` in key order (as RegistrySnapshot keeps them).
  static RoutableIndex build(const std::vector<std::shared_ptr<const Instance>>& instances);
  const RoutableGroup* find(proto::Role role, proto::Connector connector,
                            proto::TransferMode transfer_mode) const;
};

// Immutable view of the registry at one moment. Built by the discovery thread, shared read-only.
// Instances are shared between consecutive snapshots when unchanged (copy-on-write in the
// registry), so publishing costs one pointer copy per instance, not a deep copy.
struct RegistrySnapshot {
  uint64_t version = 0;               // increases by one per published snapshot
  Clock::time_point taken_at{};
  std::vector<std::shared_ptr<const Instance>> instances;  // sorted by key
  std::array<uint32_t, config::kAdmissionClasses> count_by_class{};  // registered entries per admission
  RoutableIndex routable;  // built by Registry::snapshot()

  const Instance* find(std::string_view key) const;
  size_t count(proto::Role role, InstanceState state) const;
};

using RegistrySnapshotPtr = std::shared_ptr<const RegistrySnapshot>;

}  // namespace pdr::discovery
