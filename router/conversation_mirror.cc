#include "router/conversation_mirror.h"

#include <algorithm>
#include <memory>
#include <unordered_set>
#include <utility>

#include "proto/etcd_conversation.h"
#include "router/routing/conversation_binding.h"

namespace pdr::router {

namespace {

static_assert(routing::kBindingBytes == proto::kConversationBindingBytes, "etcd keys carry whole bindings");

int64_t unix_ms(ConversationMirror::WallClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

void bump(std::atomic<uint64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

void mirror_conversations(discovery::sources::etcd::RegistryReplicator& replicator, routing::ConversationCache& cache,
                          const SnapshotCell<config::Topology>& topology) {
  const auto& options = replicator.options();
  ConversationMirror* mirror = nullptr;
  replicator.mirror_conversations([&](ReplicatorStatus& status, std::function<void()> wake) {
    auto made = std::make_unique<ConversationMirror>(cache, topology, options.prefix, options.replica_id, status,
                                                     std::move(wake));
    mirror = made.get();
    return made;
  });
  if (mirror != nullptr) cache.set_replication(mirror);
}

ConversationMirror::ConversationMirror(routing::ConversationCache& cache,
                                       const SnapshotCell<config::Topology>& topology,
                                       std::string prefix, std::string replica_id, ReplicatorStatus& status,
                                       std::function<void()> wake)
    : cache_(cache),
      topology_(topology),
      prefix_(std::move(prefix)),
      replica_id_(std::move(replica_id)),
      status_(status),
      ops_(std::move(wake)) {}

routing::ConversationCache::Limits ConversationMirror::limits() const {
  const auto topology = topology_.load();
  routing::ConversationCache::Limits limits;
  limits.ttl = topology->multi_turn.ttl;
  limits.max_entries = topology->multi_turn.max_entries;
  limits.max_bytes = topology->multi_turn.max_bytes;
  return limits;
}

void ConversationMirror::push(ConversationOp op) {
  if (!ops_.push(std::move(op))) bump(status_.conversation_failures);  // etcd is far behind: not shared
}

void ConversationMirror::close() { ops_.close(); }

void ConversationMirror::stored(const routing::ConversationCache::Key& key,
                                const routing::ConversationCache::Entry& entry,
                                std::chrono::milliseconds ttl) {
  if (key.id.size() > proto::kMaxConversationIdBytes) return;  // the request path bounds it lower
  proto::EtcdConversationEntry e;
  e.writer = replica_id_;
  e.binding = key.binding;
  e.decode_key = entry.decode_key;
  e.decode_epoch = entry.decode_epoch;
  e.expires_unix_ms = unix_ms(WallClock::now() + ttl);
  e.prefill_params = entry.prefill_params;
  ConversationOp op;
  op.key = proto::etcd_conversation_key(prefix_, key.binding, key.id);
  op.value = proto::encode_etcd_conversation(e);
  if (op.value.size() > proto::kMaxConversationValueBytes) {
    bump(status_.conversation_failures);  // other replicas would refuse it
    return;
  }
  op.lease_seconds = proto::etcd_conversation_lease_seconds(ttl.count());
  push(std::move(op));
}

void ConversationMirror::taken(const routing::ConversationCache::Key& key) {
  if (key.id.size() > proto::kMaxConversationIdBytes) return;
  ConversationOp op;
  op.key = proto::etcd_conversation_key(prefix_, key.binding, key.id);
  op.is_delete = true;
  push(std::move(op));
}

std::vector<ConversationOp> ConversationMirror::pop(size_t max) { return ops_.pop(max); }

size_t ConversationMirror::drop_queued() {
  const size_t n = ops_.drop_all();
  status_.conversation_failures.fetch_add(n, std::memory_order_relaxed);
  return n;
}

bool ConversationMirror::mirror_one(const proto::EtcdKeyValue& kv, WallClock::time_point now_wall,
                                    routing::ConversationCache::Clock::time_point now, bool restore_own,
                                    std::string* slot_out) {
  std::string binding, id;
  proto::EtcdConversationEntry entry;
  if (!proto::parse_etcd_conversation_key(prefix_, kv.key, &binding, &id).is_ok() ||
      !proto::parse_etcd_conversation(kv.value, &entry).is_ok() || entry.binding != binding) {
    bump(status_.conversation_rejected);
    return false;
  }
  const routing::ConversationCache::Key key{binding, id};
  *slot_out = routing::ConversationCache::slot_key(key);
  const bool own = entry.writer == replica_id_;
  // This replica's own, seen on the watch: the cache has it already (or took it meanwhile).
  if (own && !restore_own) return true;
  // Another writer's put made before this replica's own answered put of the key (the watch
  // delivers it late): the local entry is the newer one.
  if (auto it = own_puts_.find(kv.key);
      !own && it != own_puts_.end() && !it->second.in_flight &&
      proto::etcd_conversation_put_is_stale(kv.mod_revision, it->second.revision)) {
    bump(status_.conversation_stale);
    return true;
  }
  // The writer's wall-clock expiry mapped onto this replica's steady clock: stored_at is when an
  // entry of the current ttl would reach it. An entry past its expiry is refused.
  const auto limits = this->limits();
  const auto left = std::chrono::milliseconds(entry.expires_unix_ms - unix_ms(now_wall));
  if (left <= std::chrono::milliseconds(0)) {
    bump(status_.conversation_rejected);
    return false;
  }
  const auto stored_at = now - (left >= limits.ttl ? std::chrono::milliseconds(0) : limits.ttl - left);
  routing::ConversationCache::Entry local{std::move(entry.decode_key), entry.decode_epoch,
                                        std::move(entry.prefill_params), true};
  if (own) {
    // Stored by this replica id before a restart (or an entry this process lost): the next turn
    // may come here again. A later delete older than this put must not remove it either.
    if (!cache_.restore(key, std::move(local), stored_at, now, limits)) {
      bump(status_.conversation_rejected);
      return false;
    }
    if (auto it = own_puts_.find(kv.key); it == own_puts_.end() || !it->second.in_flight) {
      if (it != own_puts_.end() || own_puts_.size() < kMaxTrackedPuts) {
        OwnPut& tracked = own_puts_[kv.key];
        tracked.revision = std::max(tracked.revision, kv.mod_revision);
      }
    }
    return true;
  }
  if (!cache_.mirror(key, std::move(local), stored_at, now, limits)) {
    bump(status_.conversation_rejected);  // larger than multi_turn.max_bytes
    return false;
  }
  bump(status_.conversation_mirrored);
  return true;
}

void ConversationMirror::resync(const std::vector<proto::EtcdKeyValue>& kvs, WallClock::time_point now_wall,
                                routing::ConversationCache::Clock::time_point now) {
  std::unordered_set<std::string> present;
  for (const auto& kv : kvs) {
    std::string slot;
    if (mirror_one(kv, now_wall, now, /*restore_own=*/true, &slot)) present.insert(std::move(slot));
  }
  // Remote entries deleted (taken) or expired in etcd while the watch was down.
  cache_.drop_remote_except(present);
}

void ConversationMirror::apply(const std::vector<proto::EtcdEvent>& events, WallClock::time_point now_wall,
                               routing::ConversationCache::Clock::time_point now) {
  for (const auto& e : events) {
    if (!e.is_delete) {
      std::string slot;
      (void)mirror_one(e.kv, now_wall, now, /*restore_own=*/false, &slot);
      continue;
    }
    std::string binding, id;
    if (!proto::parse_etcd_conversation_key(prefix_, e.kv.key, &binding, &id).is_ok()) {
      bump(status_.conversation_rejected);
      continue;
    }
    // Taken on some replica (or its lease ended): gone here too, whoever wrote it, unless this
    // replica has put a newer entry since.
    auto own = own_puts_.find(e.kv.key);
    const auto verdict = own == own_puts_.end()
                             ? proto::ConversationDeleteVerdict::kApply
                             : proto::etcd_conversation_delete_verdict(e.kv.mod_revision, own->second.revision,
                                                                       own->second.in_flight);
    switch (verdict) {
      case proto::ConversationDeleteVerdict::kApply:
        if (own != own_puts_.end()) own_puts_.erase(own);
        (void)cache_.forget({binding, id});
        break;
      case proto::ConversationDeleteVerdict::kIgnore:
        bump(status_.conversation_stale);
        break;
      case proto::ConversationDeleteVerdict::kDefer:
        own->second.deferred_delete = std::max(own->second.deferred_delete, e.kv.mod_revision);
        break;
    }
  }
}

void ConversationMirror::put_sent(const std::string& key) {
  if (own_puts_.size() >= kMaxTrackedPuts && !own_puts_.contains(key)) {
    std::erase_if(own_puts_, [](const auto& item) { return !item.second.in_flight; });
    if (own_puts_.size() >= kMaxTrackedPuts) return;  // (not reached: puts in flight are capped lower)
  }
  own_puts_[key].in_flight = true;
}

void ConversationMirror::put_answered(const std::string& key, bool ok, int64_t revision) {
  auto it = own_puts_.find(key);
  if (it == own_puts_.end()) return;
  OwnPut& own = it->second;
  own.in_flight = false;
  const int64_t deferred = std::exchange(own.deferred_delete, 0);
  if (ok) own.revision = revision;
  // A failed put: etcd holds no newer entry of this replica; a delete seen meanwhile applies.
  if (deferred != 0 && (!ok || proto::etcd_conversation_delete_verdict(deferred, own.revision, false) ==
                                   proto::ConversationDeleteVerdict::kApply)) {
    own_puts_.erase(it);
    forget_key(key);
  } else {
    if (deferred != 0) bump(status_.conversation_stale);
    if (!ok && own.revision == 0) own_puts_.erase(it);
  }
}

void ConversationMirror::delete_sent(const std::string& key) { own_puts_.erase(key); }

void ConversationMirror::forget_key(const std::string& key) {
  std::string binding, id;
  if (proto::parse_etcd_conversation_key(prefix_, key, &binding, &id).is_ok()) (void)cache_.forget({binding, id});
}

}  // namespace pdr::router
