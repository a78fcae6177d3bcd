#include "router/session_mirror.h"

#include <utility>

#include "proto/etcd_conversation.h"
#include "proto/etcd_session.h"
#include "router/conversation_mirror.h"

namespace pdr::router {

namespace {

int64_t unix_ms(ConversationFeed::WallClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

void bump(std::atomic<uint64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }

}  // namespace

void mirror_shared_entries(discovery::sources::etcd::RegistryReplicator& replicator, routing::ConversationCache& cache,
                           routing::SessionTable& sessions, routing::SessionAffinityCounters& counters,
                           const SnapshotCell<config::Topology>& topology) {
  const auto& options = replicator.options();
  ConversationMirror* conversations = nullptr;
  SessionMirror* session_mirror = nullptr;
  replicator.mirror_conversations([&](discovery::sources::etcd::ReplicatorStatus& status, std::function<void()> wake) {
    auto c = std::make_unique<ConversationMirror>(cache, topology, options.prefix, options.replica_id, status, wake);
    auto s = std::make_unique<SessionMirror>(sessions, topology, options.prefix, options.replica_id, counters, wake);
    conversations = c.get();
    session_mirror = s.get();
    return std::make_unique<SharedEntriesFeed>(std::move(c), std::move(s), proto::etcd_sessions_prefix(options.prefix));
  });
  if (conversations != nullptr) cache.set_replication(conversations);
  if (session_mirror != nullptr) sessions.set_replication(session_mirror);
}

// --- SessionMirror ------------------------------------------------------------------------------

SessionMirror::SessionMirror(routing::SessionTable& table, const SnapshotCell<config::Topology>& topology,
                             std::string prefix, std::string replica_id, routing::SessionAffinityCounters& counters,
                             std::function<void()> wake)
    : table_(table),
      topology_(topology),
      prefix_(std::move(prefix)),
      replica_id_(std::move(replica_id)),
      counters_(counters),
      ops_(std::move(wake)) {}

void SessionMirror::bound(const routing::SessionTable::Key& key, const routing::SessionTable::Binding& binding,
                          std::chrono::milliseconds idle_ttl) {
  if (key.id.size() > proto::kMaxSessionIdBytes) return;  // the request path bounds it lower
  proto::EtcdSessionEntry e;
  e.writer = replica_id_;
  e.binding = key.binding;
  e.prefill_key = binding.prefill_key;
  e.decode_key = binding.decode_key;
  e.expires_unix_ms = unix_ms(WallClock::now() + idle_ttl);
  ConversationOp op;
  op.key = proto::etcd_session_key(prefix_, key.binding, key.id);
  op.value = proto::encode_etcd_session(e);
  op.lease_seconds = proto::etcd_conversation_lease_seconds(idle_ttl.count());
  if (!ops_.push(std::move(op))) bump(counters_.etcd_dropped);  // etcd is far behind: not shared
}

void SessionMirror::close() { ops_.close(); }

std::vector<ConversationOp> SessionMirror::pop(size_t max) { return ops_.pop(max); }

size_t SessionMirror::drop_queued() {
  const size_t n = ops_.drop_all();
  counters_.etcd_dropped.fetch_add(n, std::memory_order_relaxed);
  return n;
}

void SessionMirror::mirror_one(const proto::EtcdKeyValue& kv, WallClock::time_point now_wall, Clock::time_point now,
                               bool range) {
  std::string binding, id;
  proto::EtcdSessionEntry entry;
  if (!kv.refused.empty() || !proto::parse_etcd_session_key(prefix_, kv.key, &binding, &id).is_ok() ||
      !proto::parse_etcd_session(kv.value, &entry).is_ok() || entry.binding != binding) {
    bump(counters_.etcd_bad_values);
    return;
  }
  // This replica's own put seen on the watch: the table has it already (a range after a restart
  // with the same replica id restores it like another writer's).
  if (entry.writer == replica_id_ && !range) return;
  if (auto it = own_puts_.find(kv.key);
      entry.writer != replica_id_ && it != own_puts_.end() &&
      (it->second.in_flight || kv.mod_revision < it->second.revision)) {
    return;  // the local binding is newer (or about to be: its put is in flight)
  }
  const auto topology = topology_.load();
  const auto& config = topology->session_affinity;
  if (!config.enabled) return;  // nothing here reads bindings: hold none
  const auto left = std::chrono::milliseconds(entry.expires_unix_ms - unix_ms(now_wall));
  if (left <= std::chrono::milliseconds(0)) return;  // expired: as if gone
  // Used as long ago as the writer's idle_ttl has run down (the writer's clock maps onto ours by
  // its wall-clock expiry).
  const auto used_at = now - (left >= config.idle_ttl ? std::chrono::milliseconds(0) : config.idle_ttl - left);
  table_.mirror({binding, id}, entry.prefill_key, entry.decode_key, used_at,
                routing::SessionTable::Limits{config.max_sessions, config.idle_ttl});
  bump(counters_.etcd_mirrored);
}

void SessionMirror::resync(const std::vector<proto::EtcdKeyValue>& kvs, WallClock::time_point now_wall,
                           Clock::time_point now) {
  for (const auto& kv : kvs) mirror_one(kv, now_wall, now, /*range=*/true);
}

void SessionMirror::apply(const std::vector<proto::EtcdEvent>& events, WallClock::time_point now_wall,
                          Clock::time_point now) {
  for (const auto& e : events) {
    if (!e.is_delete) mirror_one(e.kv, now_wall, now, /*range=*/false);
  }
}

void SessionMirror::put_sent(const std::string& key) {
  if (own_puts_.size() >= kMaxTrackedPuts && !own_puts_.contains(key)) {
    std::erase_if(own_puts_, [](const auto& item) { return !item.second.in_flight; });
    if (own_puts_.size() >= kMaxTrackedPuts) return;
  }
  own_puts_[key].in_flight = true;
}

void SessionMirror::put_answered(const std::string& key, bool ok, int64_t revision) {
  bump(ok ? counters_.etcd_puts : counters_.etcd_put_failures);
  auto it = own_puts_.find(key);
  if (it == own_puts_.end()) return;
  it->second.in_flight = false;
  if (ok) it->second.revision = revision;
  if (!ok && it->second.revision == 0) own_puts_.erase(it);
}

// --- SharedEntriesFeed --------------------------------------------------------------------------

SharedEntriesFeed::SharedEntriesFeed(std::unique_ptr<ConversationFeed> conversations,
                                     std::unique_ptr<ConversationFeed> sessions, std::string sessions_prefix)
    : conversations_(std::move(conversations)),
      sessions_(std::move(sessions)),
      sessions_prefix_(std::move(sessions_prefix)) {}

void SharedEntriesFeed::close() {
  conversations_->close();
  sessions_->close();
}

std::vector<ConversationOp> SharedEntriesFeed::pop(size_t max) {
  // Neither kind starves the other: the first half of the room goes to one, in turns.
  ConversationFeed& first = sessions_first_ ? *sessions_ : *conversations_;
  ConversationFeed& second = sessions_first_ ? *conversations_ : *sessions_;
  sessions_first_ = !sessions_first_;
  std::vector<ConversationOp> out = first.pop(max > 1 ? (max + 1) / 2 : max);
  if (out.size() < max) {
    std::vector<ConversationOp> more = second.pop(max - out.size());
    for (auto& op : more) out.push_back(std::move(op));
  }
  if (out.size() < max) {
    std::vector<ConversationOp> more = first.pop(max - out.size());
    for (auto& op : more) out.push_back(std::move(op));
  }
  return out;
}

size_t SharedEntriesFeed::drop_queued() { return conversations_->drop_queued() + sessions_->drop_queued(); }

void SharedEntriesFeed::resync(const std::vector<proto::EtcdKeyValue>& kvs, WallClock::time_point now_wall,
                               Clock::time_point now) {
  std::vector<proto::EtcdKeyValue> conversations, sessions;
  for (const auto& kv : kvs) (kv.key.starts_with(sessions_prefix_) ? sessions : conversations).push_back(kv);
  conversations_->resync(conversations, now_wall, now);
  sessions_->resync(sessions, now_wall, now);
}

void SharedEntriesFeed::apply(const std::vector<proto::EtcdEvent>& events, WallClock::time_point now_wall,
                              Clock::time_point now) {
  std::vector<proto::EtcdEvent> conversations, sessions;
  for (const auto& e : events) (e.kv.key.starts_with(sessions_prefix_) ? sessions : conversations).push_back(e);
  if (!conversations.empty()) conversations_->apply(conversations, now_wall, now);
  if (!sessions.empty()) sessions_->apply(sessions, now_wall, now);
}

}  // namespace pdr::router
