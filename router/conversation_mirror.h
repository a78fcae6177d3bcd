// ConversationMirror: the multi-turn entries (router/routing/conversation_cache.h) shared through
// etcd (registry.backend: etcd; key and value: proto/etcd_conversation.h).
//
// Two halves:
//  - request threads: the cache hands every local put and every take to it (Replication);
//    it turns them into etcd operations (put with the writer's wall-clock expiry, or delete) in a
//    bounded queue and wakes the replicator's thread. A full queue drops the operation and
//    counts it as a failure: a request never waits for etcd and never fails because of it.
//  - the replicator's thread (discovery/sources/etcd/registry_replicator.h, through the
//    ConversationFeed interface of discovery/sources/etcd/conversation_feed.h) pops the operations (under its
//    in-flight cap) and feeds what etcd holds back: resync() with a full range of the prefix,
//    apply() with watch events. Entries of other writers are mirrored into the cache (marked
//    remote, bounded by the cache's limits from the current topology); a deleted key removes the
//    local entry whoever wrote it (another replica took it), unless the delete is older than
//    this replica's own put of the key (proto::etcd_conversation_delete_verdict: the replicator
//    reports each own put's revision with put_answered()); a put of another writer older than
//    it does not replace the local entry either. A key or value that does not decode,
//    is over its limit, or is already expired is rejected and counted; never stored. So is an
//    entry without a client binding (from a replica before bindings), or whose value names
//    another binding than its key: each entry keeps the binding of the client that made it.
//
// The take race: two replicas taking the same entry before either sees the other's delete both
// hand the decode's params to a prefill; one pull fails and that prefill recomputes, so the race
// costs a recompute, never an error.
//
// Threading: stored()/taken() from any thread; pop(), resync(), apply() from one thread (the
// replicator's). Counters are the replicator's (ReplicatorStatus, relaxed atomics).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "discovery/config/topology.h"
#include "proto/base/snapshot_cell.h"
#include "discovery/sources/etcd/conversation_feed.h"
#include "discovery/sources/etcd/registry_replicator.h"
#include "proto/etcd_json.h"
#include "router/etcd_op_queue.h"
#include "router/routing/conversation_cache.h"

namespace pdr::router {

using discovery::sources::etcd::ConversationOp;
using discovery::sources::etcd::ReplicatorStatus;

// Shares `cache` through `replicator` (registry.backend: etcd; once, after its start()): the
// replicator keeps the mirror, the cache hands it its changes. `cache` and `topology` outlive
// the replicator.
void mirror_conversations(discovery::sources::etcd::RegistryReplicator& replicator, routing::ConversationCache& cache,
                          const SnapshotCell<config::Topology>& topology);

class ConversationMirror : public routing::ConversationCache::Replication,
                           public discovery::sources::etcd::ConversationFeed {
 public:
  static_assert(std::is_same_v<Clock, routing::ConversationCache::Clock>, "one steady clock for the cache and etcd");
  static constexpr size_t kMaxQueued = EtcdOpQueue::kMaxQueued;

  // `wake` is called (from any thread) after an operation was queued; `status` receives the
  // conversation counters. All outlive the mirror.
  ConversationMirror(routing::ConversationCache& cache, const SnapshotCell<config::Topology>& topology,
                     std::string prefix, std::string replica_id, ReplicatorStatus& status,
                     std::function<void()> wake);

  void stored(const routing::ConversationCache::Key& key, const routing::ConversationCache::Entry& entry,
              std::chrono::milliseconds ttl) override;
  void taken(const routing::ConversationCache::Key& key) override;

  // No more wakes (the replicator's thread is stopping): later operations are dropped.
  void close() override;

  // Up to `max` queued operations, oldest first.
  std::vector<ConversationOp> pop(size_t max) override;
  // Drops every queued operation, counting each as a failure (etcd unreachable); returns how many.
  size_t drop_queued() override;

  // A full range of the prefix: mirrors every valid entry of another writer, restores this
  // replica id's own entries the cache does not hold (a restart with the same replica_id), and
  // removes the remote entries etcd no longer holds. `now_wall` / `now` are the two clocks at this moment.
  void resync(const std::vector<proto::EtcdKeyValue>& kvs, WallClock::time_point now_wall,
              routing::ConversationCache::Clock::time_point now) override;
  void apply(const std::vector<proto::EtcdEvent>& events, WallClock::time_point now_wall,
             routing::ConversationCache::Clock::time_point now) override;

  // The replicator's own operations on a key, so a late delete of another replica's take never
  // removes a newer entry stored here: a put sent, its answer (etcd's revision when `ok`), a
  // delete sent (this replica took the entry). A delete event that came while the put was in
  // flight is applied here, once the put's revision shows it is newer.
  void put_sent(const std::string& key) override;
  void put_answered(const std::string& key, bool ok, int64_t revision) override;
  void delete_sent(const std::string& key) override;

  const std::string& prefix() const { return prefix_; }

 private:
  // This replica's last put of a key as etcd knows it (replicator's thread only). At most
  // kMaxTrackedPuts; beyond, the answered ones are forgotten (their late deletes apply as before).
  struct OwnPut {
    int64_t revision = 0;         // of the last answered put (0: none yet)
    bool in_flight = false;
    int64_t deferred_delete = 0;  // a delete event's revision seen while the put was in flight
  };
  static constexpr size_t kMaxTrackedPuts = 1 << 16;
  void forget_key(const std::string& key);
  // Mirrors one put; false (counted) when rejected. Own entries (this replica id's) are skipped
  // (true), or with `restore_own` (a range: after a restart with the same replica_id) restored
  // into the cache unless it holds the conversation already (ConversationCache::restore).
  // *slot_out: the entry's ConversationCache::slot_key().
  bool mirror_one(const proto::EtcdKeyValue& kv, WallClock::time_point now_wall,
                  routing::ConversationCache::Clock::time_point now, bool restore_own, std::string* slot_out);
  void push(ConversationOp op);
  routing::ConversationCache::Limits limits() const;

  routing::ConversationCache& cache_;
  const SnapshotCell<config::Topology>& topology_;
  std::string prefix_;
  std::string replica_id_;
  ReplicatorStatus& status_;
  EtcdOpQueue ops_;
  std::unordered_map<std::string, OwnPut> own_puts_;  // etcd key -> this replica's put
};

}  // namespace pdr::router
