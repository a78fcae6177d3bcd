// SessionMirror: session affinity's bindings (router/routing/session_table.h) shared through etcd
// (registry.backend: etcd; key and value: proto/etcd_session.h), so every replica sends a
// session's turns to the same nodes whichever replica gets them.
//
// The registry replicator (discovery/sources/etcd/registry_replicator.h) shares one feed
// (conversation_feed.h) over <prefix>conversations/; the bindings live under
// <prefix>conversations/session/ and SharedEntriesFeed splits that feed between the
// conversation mirror (router/conversation_mirror.h) and this one by key, so the replicator's
// range, watch, lease and in-flight cap serve both without a second etcd client.
//
//  - request threads: the table hands every local bind (and every refresh of a binding that
//    stays) to bound(); it becomes a put with the writer's wall-clock expiry (idle_ttl ahead) on
//    a lease covering idle_ttl, in a bounded queue (kMaxQueued: beyond, the put is dropped and
//    counted); a request never waits for etcd.
//  - the replicator's thread: puts of other writers (range and watch) are checked (key and value
//    decode, the value's binding is the key's, not expired) and mirrored into the table; bad ones
//    are counted, never stored. The latest put of a key wins (the watch delivers in revision
//    order), except that another writer's put older than this replica's own answered put of the
//    key, or arriving while that put is in flight, is ignored (the local binding is newer).
//    With session_affinity off here, other replicas' bindings are not kept (a reload that turns it
//    on takes them from the next range or put). Deletes (lease expiry) are not applied: each replica forgets a binding after idle_ttl
//    without a turn on its own.
//
// Threading: bound() from any thread; the ConversationFeed calls from the replicator's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "discovery/config/topology.h"
#include "discovery/sources/etcd/conversation_feed.h"
#include "discovery/sources/etcd/registry_replicator.h"
#include "proto/base/snapshot_cell.h"
#include "router/routing/conversation_cache.h"
#include "router/routing/session_affinity_counters.h"
#include "router/etcd_op_queue.h"
#include "router/routing/session_table.h"

namespace pdr::router {

using discovery::sources::etcd::ConversationFeed;
using discovery::sources::etcd::ConversationOp;

// Shares the conversation cache and the session table through `replicator` (once, after its
// start()); replaces mirror_conversations() where both are wanted. All arguments outlive the
// replicator.
void mirror_shared_entries(discovery::sources::etcd::RegistryReplicator& replicator, routing::ConversationCache& cache,
                           routing::SessionTable& sessions, routing::SessionAffinityCounters& counters,
                           const SnapshotCell<config::Topology>& topology);

class SessionMirror : public routing::SessionTable::Replication, public ConversationFeed {
 public:
  static constexpr size_t kMaxQueued = EtcdOpQueue::kMaxQueued;

  SessionMirror(routing::SessionTable& table, const SnapshotCell<config::Topology>& topology, std::string prefix,
                std::string replica_id, routing::SessionAffinityCounters& counters, std::function<void()> wake);

  void bound(const routing::SessionTable::Key& key, const routing::SessionTable::Binding& binding,
             std::chrono::milliseconds idle_ttl) override;

  void close() override;
  std::vector<ConversationOp> pop(size_t max) override;
  size_t drop_queued() override;
  void resync(const std::vector<proto::EtcdKeyValue>& kvs, WallClock::time_point now_wall, Clock::time_point now) override;
  void apply(const std::vector<proto::EtcdEvent>& events, WallClock::time_point now_wall, Clock::time_point now) override;
  void put_sent(const std::string& key) override;
  void put_answered(const std::string& key, bool ok, int64_t revision) override;
  void delete_sent(const std::string&) override {}

 private:
  struct OwnPut {
    int64_t revision = 0;
    bool in_flight = false;
  };
  static constexpr size_t kMaxTrackedPuts = 1 << 16;
  void mirror_one(const proto::EtcdKeyValue& kv, WallClock::time_point now_wall, Clock::time_point now, bool range);

  routing::SessionTable& table_;
  const SnapshotCell<config::Topology>& topology_;
  std::string prefix_;
  std::string replica_id_;
  routing::SessionAffinityCounters& counters_;
  EtcdOpQueue ops_;
  std::unordered_map<std::string, OwnPut> own_puts_;  // replicator's thread only
};

// One feed for the replicator over <prefix>conversations/: keys under <prefix>conversations/
// session/ go to `sessions`, the others to `conversations`; pop() takes from both in turn.
class SharedEntriesFeed : public ConversationFeed {
 public:
  SharedEntriesFeed(std::unique_ptr<ConversationFeed> conversations, std::unique_ptr<ConversationFeed> sessions,
                    std::string sessions_prefix);

  void close() override;
  std::vector<ConversationOp> pop(size_t max) override;
  size_t drop_queued() override;
  void resync(const std::vector<proto::EtcdKeyValue>& kvs, WallClock::time_point now_wall, Clock::time_point now) override;
  void apply(const std::vector<proto::EtcdEvent>& events, WallClock::time_point now_wall, Clock::time_point now) override;
  void put_sent(const std::string& key) override { of(key).put_sent(key); }
  void put_answered(const std::string& key, bool ok, int64_t revision) override {
    of(key).put_answered(key, ok, revision);
  }
  void delete_sent(const std::string& key) override { of(key).delete_sent(key); }

 private:
  ConversationFeed& of(std::string_view key) {
    return key.starts_with(sessions_prefix_) ? *sessions_ : *conversations_;
  }
  std::unique_ptr<ConversationFeed> conversations_, sessions_;
  std::string sessions_prefix_;
  bool sessions_first_ = false;  // pop() alternates which queue it drains first
};

}  // namespace pdr::router
