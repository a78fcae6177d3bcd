// Registry: the live set of prefill/decode instances, owned by the discovery thread.
//
// Not thread-safe: exactly one thread (the discovery thread) calls every method. Other threads see
// the registry only through the immutable RegistrySnapshot values this class builds.
//
// Keyed by the node's canonical HTTP address. Every registration message is an upsert and a
// heartbeat: it (re)sets that instance's own expiry deadline to now + TTL. Expiry pops a min-heap
// of deadlines, so it finds exactly the due entries whatever their insertion order (the P2P-NCCL
// proxy's walk-from-oldest-inserted bug, PROTOCOLS.md section 2, cannot happen here).
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
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "discovery/instance.h"
#include "discovery/topology.h"
#include "proto/discovery_message.h"

namespace pdr::discovery {

struct RegistryOptions {
  std::chrono::milliseconds default_ttl{5000};
  std::chrono::milliseconds min_ttl{1000};
  std::chrono::milliseconds max_ttl{300000};
  std::chrono::milliseconds expired_retention{60000};
  uint32_t max_instances = 4096;

  static RegistryOptions from(const Topology::Discovery& d);
};

enum class UpsertResult : uint8_t {
  kAdded,         // new key
  kUpdated,       // known key, same process: heartbeat
  kRestarted,     // known key, new epoch: the node restarted
  kRevived,       // known key that had expired (or said goodbye) is back
  kRejectedFull,  // registry at max_instances and nothing expired to evict
};
std::string_view to_string(UpsertResult);

enum class GoodbyeResult : uint8_t { kRemoved, kUnknown, kStaleEpoch };

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
  UpsertOutcome upsert(const proto::Registration& reg, Clock::time_point now);

  // Goodbye: a registered instance is removed at once; a static/admin one is marked expired until
  // it registers again. A goodbye whose epoch names an older process than the entry's is ignored
  // (kStaleEpoch), so a late goodbye cannot remove a restarted node.
  GoodbyeResult goodbye(const proto::Goodbye& goodbye, Clock::time_point now);

  // Replaces every static instance with `instances` (topology load or reload). Registered
  // instances at the same address become static (the operator's word wins); static instances no
  // longer listed are removed.
  void replace_static(const std::vector<StaticInstance>& instances, Clock::time_point now);

  // Admin instances: described by the operator like static ones and, like them, they never expire
  // and nodes' heartbeats only refresh their liveness and identity. They live in memory only
  // (gone on restart), and a topology reload that lists the same address turns them static.
  //
  // add_admin: a new key is created (kCreated). A key the topology owns (static) or the admin API
  // already added is a conflict: the operator removes or edits the owner first, nothing is
  // silently overwritten. A node-registered key (live or expired) is taken over (kReplaced), as
  // replace_static does: the operator's description wins, the node's liveness, identity and
  // drain flags are kept, and the entry stops expiring.
  AdminOutcome add_admin(const StaticInstance& spec, Clock::time_point now);
  // Removes an admin or registered entry at once. A registered node that is still running comes
  // back with its next heartbeat (drain it to stop traffic instead). Static entries are refused
  // (kConflict): the topology file owns them and the next reload would bring them back.
  AdminOutcome remove(std::string_view key);
  // Sets or clears the operator drain of any entry (static, admin or registered). A drained
  // instance shows state "draining" until undrained, whatever its heartbeats say; an expired one
  // stays expired (and comes back draining). Idempotent.
  AdminOutcome set_operator_drain(std::string_view key, bool drain);

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

 private:
  struct Entry {
    std::shared_ptr<const Instance> instance;
    Clock::time_point deadline = kNever;   // next event: expiry (up) or removal (expired)
    Clock::time_point scheduled = kNever;  // time of this entry's item in heap_, kNever if none
  };
  using EntryMap = std::map<std::string, Entry, std::less<>>;
  using HeapItem = std::pair<Clock::time_point, std::string>;
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
  bool evict_one_expired();
  std::chrono::milliseconds effective_ttl(const proto::Registration& reg) const;

  RegistryOptions options_;
  EntryMap entries_;
  std::vector<HeapItem> heap_;  // min-heap on time (std::greater)
  uint64_t version_ = 0;
  bool dirty_ = true;  // the first snapshot is always wanted
};

// Fills an Instance's node-supplied descriptive fields from a registration (not liveness).
void apply_registration(const proto::Registration& reg, Instance* inst);
// True when applying `reg` would change none of those fields.
bool registration_matches(const proto::Registration& reg, const Instance& inst);

}  // namespace pdr::discovery
