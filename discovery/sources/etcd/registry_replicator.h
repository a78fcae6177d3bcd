// RegistryReplicator: replicas sharing one registry through etcd (registry.backend: etcd).
//
// Each replica publishes what it alone learnt (its local entries: registered on its discovery
// socket, static, admin; not the ones it learnt from other replicas) under
//   <prefix>nodes/<replica_id>/<node key>   value: the entry as a pdrouter registration (msgpack)
//                                           plus its admission class (proto/etcd_registry_entry.h)
// attached to one etcd lease of this replica (TTL lease_ttl). It writes ON CHANGE only: a
// heartbeat that changes nothing of what /status or routing reads does not publish a registry
// snapshot, so it writes nothing; liveness stays local (lease keepalives, one per lease_ttl / 3
// and one at each resync, keep the entries alive). An entry that expires locally, says goodbye or is removed is deleted.
//
// It watches <prefix>nodes/ (from the revision of a full range, so nothing is missed) and merges
// the other replicas' entries into the registry as InstanceSource::kReplica entries
// (Registry::upsert_replica / remove_replica, posted to the discovery thread like admin
// changes), with the class each was admitted with on its replica: the weaker-sender rule holds
// across replicas. When two replicas publish the same node, the entry of the stronger sender
// wins, then the newest write. A deleted key or an expired lease (a dead replica) removes the
// entry.
//
// At most kMaxReplicatorInFlight (256) puts and deletes are in flight at once; what does not
// fit waits for the next scan. A lease found gone (a keepalive answering TTL 0, or a put
// answering gRPC NotFound: "requested lease not found", e.g. revoked by an operator or
// expired while etcd was slow) is dropped: the resync grants a new one and writes every local
// entry again, instead of retrying on the dead lease forever.
//
// etcd unreachable (a failed keepalive, a watch that ends, a failed write): the registry keeps
// its last view plus what this replica learns itself; status() says so; the replicator tries
// again after retry_interval, doubling up to max_retry_interval while the failures go on, and,
// once etcd answers, resyncs: new lease if the old one is gone, full range (read in pages at one
// revision; entries that vanished meanwhile are removed), watch from that revision, every local
// entry written again.
//
// Bad data is not unreachability: a key-value under <prefix>nodes/ whose key or value is over
// its limit, not base64, or not a registry entry is skipped and counted (bad_entries,
// last_bad_entry()); an entry another replica held under that key is dropped, as etcd no
// longer holds it. Nothing any writer stores there can stop replication.
//
// Multi-turn entries (mirror_conversations(); conversation_feed.h, which the router's
// router/conversation_mirror.h implements over its conversation cache): the same thread writes the
// entries of this replica under <prefix>conversations/ (each on a lease that covers multi_turn's
// TTL: leases of that TTL plus a rotation period, a new one per period, so no keepalives and no
// key outlives its entry by more than the period), deletes the keys of entries taken here, and
// mirrors the prefix (full range after the nodes' range on every resync, then a watch) into the
// cache; the range also restores the entries written under this replica's own id (a restart with
// the same replica_id), and revisions keep a late delete or put from replacing a newer own entry. Those puts and deletes share the in-flight cap and go out in order, one at a time per
// key; a failed one is counted and never fails the connection or a request. While etcd is
// unreachable they are dropped and counted.
//
// Threads: start() and stop() from the owner's thread; everything else runs on the replicator's
// own thread and libuv loop (discovery/sources/loop_thread.h). status() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "proto/base/snapshot_cell.h"
#include "proto/base/status.h"
#include "discovery/discovery_service.h"
#include "discovery/instance.h"
#include "discovery/config/topology.h"
#include "discovery/sources/etcd/conversation_feed.h"
#include "discovery/sources/etcd/etcd_client.h"

namespace pdr::discovery::sources::etcd {

inline constexpr size_t kMaxReplicatorInFlight = 256;

struct RegistryReplicatorOptions {
  EtcdClientOptions etcd;
  std::string prefix = "/pdrouter/";
  std::string replica_id;  // unique per running replica
  std::chrono::seconds lease_ttl{10};
  // After a failure the replicator tries again after retry_interval, doubling with each failure
  // in a row up to max_retry_interval, and back to retry_interval once in sync.
  std::chrono::milliseconds retry_interval{500};
  std::chrono::milliseconds max_retry_interval{8000};
  // How often the registry snapshot is checked for changes to publish.
  std::chrono::milliseconds scan_interval{50};
};

// Counters (any thread; relaxed).
struct ReplicatorStatus {
  std::atomic<bool> reachable{false};
  std::atomic<uint64_t> puts{0};
  std::atomic<uint64_t> deletes{0};
  std::atomic<uint64_t> keepalives{0};
  std::atomic<uint64_t> watch_events{0};
  std::atomic<uint64_t> resyncs{0};        // full range + watch restarts
  std::atomic<uint64_t> failures{0};       // calls that failed (etcd unreachable or refusing)
  // Key-values under <prefix>nodes/ refused one by one (a key or value over its limit, not
  // base64, not a registry entry): data someone wrote to etcd, never a reason to call etcd
  // unreachable; the rest of the range or watch answer is read as usual.
  std::atomic<uint64_t> bad_entries{0};
  std::atomic<uint64_t> retry_delay_ms{0};  // the wait before the next retry while out of sync (gauge)
  std::atomic<uint64_t> replica_entries{0};  // entries learnt from other replicas (gauge)
  std::atomic<uint64_t> in_flight{0};        // puts and deletes sent, not yet answered (gauge;
                                             // registry entries and conversations together)
  std::atomic<uint64_t> in_flight_max{0};    // the most ever in flight at once (at most 256)
  std::atomic<uint64_t> lease_grants{0};     // leases granted (the first one included)
  std::atomic<uint64_t> leases_lost{0};      // leases found gone (expired or revoked): a new one
  // Multi-turn conversation entries (conversation_feed.h): counted here and by the feed
  // (router/conversation_mirror.h).
  std::atomic<uint64_t> conversation_puts{0};      // entries of this replica written
  std::atomic<uint64_t> conversation_deletes{0};   // keys deleted (entries taken here)
  std::atomic<uint64_t> conversation_failures{0};  // puts/deletes that failed or were dropped
  std::atomic<uint64_t> conversation_mirrored{0};  // entries of other replicas mirrored
  std::atomic<uint64_t> conversation_rejected{0};  // keys/values that did not decode, or expired
  std::atomic<uint64_t> conversation_stale{0};     // deletes/puts older than this replica's own put, ignored
};

class RegistryReplicator {
 public:
  RegistryReplicator(SnapshotCell<discovery::RegistrySnapshot>& snapshots,
                     discovery::DiscoveryService& discovery);
  ~RegistryReplicator();  // stop()
  RegistryReplicator(const RegistryReplicator&) = delete;
  RegistryReplicator& operator=(const RegistryReplicator&) = delete;

  Status start(RegistryReplicatorOptions options);
  // Revokes the lease when etcd answers within a second (the other replicas drop this one's
  // entries at once instead of after lease_ttl), then joins the thread. Idempotent.
  void stop();

  // Shares multi-turn entries through etcd from now on (once, after start()): `make` builds the
  // feed (conversation_feed.h) on the caller's thread, given the counters it keeps and the
  // function it calls, from any thread, after queueing an operation; the replicator keeps it
  // until destruction. The conversations prefix is ranged and watched from the next point the
  // replicator is in sync (at once if it is). Returns the feed, or null (not started, or a feed
  // already attached).
  using FeedFactory =
      std::function<std::unique_ptr<ConversationFeed>(ReplicatorStatus& status, std::function<void()> wake)>;
  ConversationFeed* mirror_conversations(const FeedFactory& make);

  const ReplicatorStatus& status() const { return status_; }
  const RegistryReplicatorOptions& options() const { return options_; }
  std::string last_error() const;
  // Why the latest bad entry was refused, with its key ("" if none so far).
  std::string last_bad_entry() const;

 private:
  class Impl;
  SnapshotCell<discovery::RegistrySnapshot>& snapshots_;
  discovery::DiscoveryService& discovery_;
  RegistryReplicatorOptions options_;
  ReplicatorStatus status_;
  std::unique_ptr<Impl> impl_;
};

// The registration a replica publishes for one of its entries (pdrouter format, no load, drain
// flag = node or operator drain), published with replica_origin() (proto/etcd_registry_entry.h),
// and its etcd key.
proto::Registration replica_registration(const discovery::Instance& inst);
// How the entry's node proved who it is here: its admission class, or the operator's entry.
discovery::ReplicaOrigin replica_origin(const discovery::Instance& inst);
std::string replica_key(const std::string& prefix, const std::string& replica_id, const std::string& node_key);
// Splits a key under <prefix>nodes/ into replica id and node key; false for anything else.
bool parse_replica_key(const std::string& prefix, std::string_view key, std::string* replica_id,
                       std::string* node_key);

}  // namespace pdr::discovery::sources::etcd
