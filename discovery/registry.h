// Registry: the live set of prefill/decode instances, owned by the discovery thread.
//
// Not thread-safe: exactly one thread (the discovery thread) calls every method. Other threads see
// the registry only through the immutable RegistrySnapshot values this class builds.
//
// Keyed by the node's canonical HTTP address. Every registration message is an upsert and a
// heartbeat: it (re)sets that instance's own expiry deadline to now + TTL. Expiry walks a set
// ordered by deadline, so it finds exactly the due entries whatever their insertion order (the
// P2P-NCCL proxy's walk-from-oldest-inserted bug, PROTOCOLS.md section 2, cannot happen here).
// Expired instances stay visible as state "expired" for `expired_retention`, then disappear.
// Static instances (from the topology) and admin-added ones never expire.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
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

  struct ExpireResult {
    size_t expired = 0;  // up/draining -> expired
    size_t removed = 0;  // expired entries past retention, dropped
  };
  ExpireResult expire_due(Clock::time_point now);
  // Earliest time expire_due() has work to do; nullopt when nothing can expire.
  std::optional<Clock::time_point> next_deadline() const;

  // Structural changes (add, remove, state or field change) want an immediate snapshot; liveness
  // changes (last_seen, load) may be coalesced by the caller.
  bool structural_dirty() const { return structural_dirty_; }
  bool liveness_dirty() const { return liveness_dirty_; }
  // Builds the next snapshot (version + 1) and clears both dirty flags.
  RegistrySnapshotPtr snapshot(Clock::time_point now);

  size_t size() const { return entries_.size(); }
  uint64_t version() const { return version_; }

 private:
  struct Entry {
    std::shared_ptr<const Instance> instance;
    Clock::time_point deadline;  // next event: expiry (up) or removal (expired); max() = none
  };
  using EntryMap = std::map<std::string, Entry, std::less<>>;

  // Copy-on-write access: replaces the entry's instance with a private copy and returns it.
  Instance& mutable_instance(Entry& entry);
  void set_deadline(EntryMap::iterator it, Clock::time_point deadline);
  void erase(EntryMap::iterator it);
  bool evict_one_expired();
  std::chrono::milliseconds effective_ttl(const proto::Registration& reg) const;

  RegistryOptions options_;
  EntryMap entries_;
  std::set<std::pair<Clock::time_point, std::string>, std::less<>> deadlines_;
  uint64_t version_ = 0;
  bool structural_dirty_ = true;  // the first snapshot is always wanted
  bool liveness_dirty_ = false;
};

// Fills an Instance's node-supplied fields from a registration (shared by upsert and tests).
void apply_registration(const proto::Registration& reg, Instance* inst);

}  // namespace pdr::discovery
