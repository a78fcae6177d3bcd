// Registry: the live set of prefill/decode instances, owned by the discovery thread.
//
// Not thread-safe: exactly one thread (the discovery thread) calls every method. Other threads see
// the registry only through the immutable RegistrySnapshot values this class builds.
//
// Keyed by the node's canonical HTTP address. Every registration message is an upsert and a
// heartbeat: it (re)sets that instance's own expiry deadline to now + TTL. Expiry pops a min-heap
// of deadlines, so it finds exactly the due entries whatever their insertion order (the P2P-NCCL
// proxy's walk-from-oldest-inserted bug, docs/design/wire-formats.md section 2, cannot happen here).
// Expired instances stay visible as state "expired" for `expired_retention`, then disappear.
// Static instances (from the topology) and admin-added ones never expire.
//
// Cost model (10k nodes heartbeating every 3 s is the design point): a heartbeat that repeats
// what the node said before touches only the node's InstanceLiveness atomics and its deadline
// field; no allocation, no heap operation, no snapshot. The heap holds one item per entry and is
// lazily rescheduled: when an item surfaces before its entry's (since extended) deadline, it is
// pushed back with the current deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <array>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "discovery/config/admission.h"
#include "discovery/instance.h"
#include "discovery/config/topology.h"
#include "proto/discovery_message.h"

namespace pdr::discovery {

struct RegistryOptions {
  std::chrono::milliseconds default_ttl{5000};
  std::chrono::milliseconds min_ttl{1000};
  std::chrono::milliseconds max_ttl{300000};
  std::chrono::milliseconds expired_retention{60000};
  uint32_t max_instances = 4096;
  // Registered entries per admission class (discovery.max_instances_per_class), within
  // max_instances: a flood of weakly admitted senders cannot take the room of stronger ones.
  std::array<uint32_t, config::kAdmissionClasses> max_per_class{4096, 4096, 4096, 4096};

  static RegistryOptions from(const config::Topology::Discovery& d);
};

enum class UpsertResult : uint8_t {
  kAdded,         // new key
  kUpdated,       // known key, same process: heartbeat
  kRestarted,     // known key, new epoch: the node restarted
  kRevived,       // known key that had expired (or said goodbye) is back
  kRejectedFull,  // registry at max_instances and nothing expired to evict
  kRejectedClassFull,  // the sender's admission class is at its cap, nothing of it expired
  kRejectedWeaker,     // the entry was created by a stronger admission class
  kRejectedStaleEpoch, // the entry's process is newer than the sender's epoch
};
std::string_view to_string(UpsertResult);

enum class GoodbyeResult : uint8_t {
  kRemoved,
  kUnknown,
  kStaleEpoch,     // the goodbye does not carry the entry's current epoch
  kWeaker,         // the entry was created by a stronger admission class
  kOperatorOwned,  // static and admin entries are the operator's: goodbyes never touch them
};
std::string_view to_string(GoodbyeResult);

// Operator changes through the admin API (Registry::add_admin, remove, set_operator_drain).
enum class AdminResult : uint8_t {
  kCreated,       // add: new entry
  kReplaced,      // add: a node-registered entry became an admin one (see add_admin)
  kOk,            // remove, drain, undrain: done (also when there was nothing to change)
  kNotFound,      // no entry with that key
  kConflict,      // add over a static or admin entry; remove of a static entry
  kRejectedFull,  // add: registry at max_instances and nothing expired to evict
};
std::string_view to_string(AdminResult);

struct AdminOutcome {
  AdminResult result = AdminResult::kOk;
  // The entry after the operation (for remove: as it was; for kConflict: the existing entry);
  // null for kNotFound and kRejectedFull. Immutable and safe to hand to other threads.
  std::shared_ptr<const Instance> instance;
  std::string message;  // why, for kNotFound, kConflict and kRejectedFull
};

class Registry {
 public:
  explicit Registry(RegistryOptions options);

  // New bounds apply from the next message of each instance; existing deadlines are kept.
  void set_options(const RegistryOptions& options);
  const RegistryOptions& options() const { return options_; }

  struct UpsertOutcome {
    UpsertResult result;
    std::chrono::milliseconds ttl;  // TTL applied (requested ttl_ms clamped to bounds)
  };
  // `sender`: how the message's sender was admitted (discovery/config/admission.h). A new entry records
  // it and counts against its class's cap. A registered entry accepts messages only from its own
  // class or a stronger one (a stronger one takes the entry over). Static and admin entries take
  // liveness, load and identity from any admitted sender, and the node's drain flag only from an
  // authenticated one. A registration with an older epoch than the entry's is refused: an older
  // epoch is a stale message, not a restart.
  UpsertOutcome upsert(const proto::Registration& reg, Clock::time_point now,
                       config::AdmissionClass sender = config::AdmissionClass::kAddress);

  // Goodbye: a registered instance is removed at once. Refused when the sender's class is weaker
  // than the entry's, when the entry has an epoch and the goodbye does not carry exactly that
  // epoch (a late goodbye cannot remove a restarted node), and always for static and admin
  // entries (the operator's; only the operator removes them).
  GoodbyeResult goodbye(const proto::Goodbye& goodbye, Clock::time_point now,
                        config::AdmissionClass sender = config::AdmissionClass::kAddress);

  // Replaces every static instance with `instances` (topology load or reload). Registered
  // instances at the same address become static (the operator's word wins); static instances no
  // longer listed are removed.
  void replace_static(const std::vector<config::StaticInstance>& instances, Clock::time_point now);

  // Admin instances: described by the operator like static ones and, like them, they never expire
  // and nodes' heartbeats only refresh their liveness and identity. They live in memory only
  // (gone on restart), and a topology reload that lists the same address turns them static.
  //
  // add_admin: a new key is created (kCreated). A key the topology owns (static) or the admin API
  // already added is a conflict: the operator removes or edits the owner first, nothing is
  // silently overwritten. A node-registered key (live or expired) is taken over (kReplaced), as
  // replace_static does: the operator's description wins, the node's liveness, identity and
  // drain flags are kept, and the entry stops expiring.
  AdminOutcome add_admin(const config::StaticInstance& spec, Clock::time_point now);
  // Removes an admin or registered entry at once. A registered node that is still running comes
  // back with its next heartbeat (drain it to stop traffic instead). Static entries are refused
  // (kConflict): the topology file owns them and the next reload would bring them back.
  AdminOutcome remove(std::string_view key);
  // Sets or clears the operator drain of any entry (static, admin or registered). A drained
  // instance shows state "draining" until undrained, whatever its heartbeats say; an expired one
  // stays expired (and comes back draining). Idempotent.
  AdminOutcome set_operator_drain(std::string_view key, bool drain);

  // Entries another replica owns (registry.backend: etcd; discovery/sources/etcd/registry_replicator.h).
  // upsert_replica creates or refreshes a kReplica entry from that replica's registration (its
  // drain flag included) and `origin` (how the node proved who it is there); it never expires
  // here (the owner's etcd lease does that) and keeps a local operator drain. A local static,
  // admin or Kubernetes entry at the key wins (kConflict), and so does a registered one of at
  // least the origin's rank; a registered one of a weaker class is replaced (kReplaced): the
  // weaker-sender rule holds across replicas, whichever replica the weaker sender talked to.
  // A local registration for a kReplica key takes the entry over when its sender is at least as
  // strong as the origin (upsert), so a node moving to this replica stays routable; a weaker one
  // is refused (kRejectedWeaker), and one for an operator entry of the owner only refreshes the
  // entry's liveness, as for a local static entry. remove_replica drops a kReplica entry
  // (kNotFound otherwise).
  AdminOutcome upsert_replica(const proto::Registration& reg, ReplicaOrigin origin, Clock::time_point now);
  AdminOutcome remove_replica(std::string_view key);

  // Pods found by Kubernetes pod discovery (discovery/sources/kubernetes/pod_watcher.h): kKubernetes entries, with
  // the rules of replica entries (never expire here, keep a local operator drain, a local entry
  // at the key wins with kConflict), but a node's own registration at the key only refreshes its
  // liveness and identity, as for static entries. A kReplica entry at the key is replaced: this
  // replica sees the pod itself.
  AdminOutcome upsert_kubernetes(const proto::Registration& reg, Clock::time_point now);
  AdminOutcome remove_kubernetes(std::string_view key);

  struct ExpireResult {
    size_t expired = 0;  // up/draining -> expired
    size_t removed = 0;  // expired entries past retention, dropped
  };
  ExpireResult expire_due(Clock::time_point now);
  // When to call expire_due() next: never later than the earliest real deadline, possibly earlier
  // (a superseded heap item; that call then does nothing). nullopt when nothing is scheduled.
  std::optional<Clock::time_point> next_deadline() const;

  // True after any change a snapshot must show (add, remove, state or field change). Liveness
  // (last_seen, load) never sets it: snapshots share each node's live InstanceLiveness cell.
  bool dirty() const { return dirty_; }
  // Builds the next snapshot (version + 1) and clears dirty().
  RegistrySnapshotPtr snapshot(Clock::time_point now);

  size_t size() const { return entries_.size(); }
  uint64_t version() const { return version_; }
  // Registered entries (live or expired) per admission class.
  const std::array<uint32_t, config::kAdmissionClasses>& count_by_class() const { return count_by_class_; }

 private:
  struct Entry {
    std::shared_ptr<const Instance> instance;
    Clock::time_point deadline = kNever;   // next event: expiry (up) or removal (expired)
    Clock::time_point scheduled = kNever;  // time of this entry's item in heap_, kNever if none
    Clock::time_point expired_at = kNever; // its key in expired_, kNever when not in it
  };
  using EntryMap = std::map<std::string, Entry, std::less<>>;
  using HeapItem = std::pair<Clock::time_point, std::string>;
  // Expired registered entries per admission class, oldest first: eviction is O(log n).
  using ExpiredIndex = std::set<std::pair<Clock::time_point, std::string>, std::less<>>;
  static constexpr Clock::time_point kNever = Clock::time_point::max();

  // Copy-on-write access: replaces the entry's instance with a private copy and returns it. The
  // copy shares the node's InstanceLiveness cell.
  Instance& mutable_instance(Entry& entry);
  // Installs an operator-described `fresh` over an existing entry, keeping what only the node can
  // tell (liveness, identity, restarts, drain flags); the entry no longer expires. Returns whether
  // a snapshot must show the change.
  bool take_over(EntryMap::iterator it, Instance fresh);
  // Adds an operator-described entry that never expires.
  std::shared_ptr<const Instance> insert_never_expiring(Instance fresh, Clock::time_point now);
  void set_deadline(EntryMap::iterator it, Clock::time_point deadline);
  void erase(EntryMap::iterator it);
  void mark_expired(EntryMap::iterator it, Clock::time_point now);
  void unmark_expired(EntryMap::iterator it);
  // Evicts the longest-expired registered entry: of class `only` if given, else of any class.
  bool evict_one_expired(std::optional<config::AdmissionClass> only = std::nullopt);
  // Room for a new registered entry of class `c`: evicts an expired entry if that makes room.
  UpsertResult make_room(config::AdmissionClass c);
  std::chrono::milliseconds effective_ttl(const proto::Registration& reg) const;
  // upsert_replica / upsert_kubernetes: entries another owner (`source`) ends.
  AdminOutcome upsert_owned(const proto::Registration& reg, InstanceSource source, ReplicaOrigin origin,
                            Clock::time_point now);
  AdminOutcome remove_owned(std::string_view key, InstanceSource source);

  RegistryOptions options_;
  EntryMap entries_;
  std::vector<HeapItem> heap_;  // min-heap on time (std::greater)
  std::array<ExpiredIndex, config::kAdmissionClasses> expired_;
  std::array<uint32_t, config::kAdmissionClasses> count_by_class_{};
  uint64_t version_ = 0;
  bool dirty_ = true;  // the first snapshot is always wanted
};

// Fills an Instance's node-supplied descriptive fields from a registration (not liveness).
void apply_registration(const proto::Registration& reg, Instance* inst);
// True when applying `reg` would change none of those fields.
bool registration_matches(const proto::Registration& reg, const Instance& inst);

}  // namespace pdr::discovery
