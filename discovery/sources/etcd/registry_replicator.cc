#include "discovery/sources/etcd/registry_replicator.h"

#include "proto/base/log.h"
#include "proto/base/log_limiter.h"

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "proto/discovery_message.h"
#include "proto/etcd_conversation.h"
#include "proto/etcd_registry_entry.h"
#include "discovery/sources/loop_thread.h"

namespace pdr::discovery::sources::etcd {

namespace {
constexpr int kGrpcNotFound = 5;  // google.golang.org/grpc/codes.NotFound
}  // namespace

using discovery::Clock;
using discovery::Instance;
using discovery::InstanceSource;
using discovery::InstanceState;

discovery::ReplicaOrigin replica_origin(const Instance& inst) {
  switch (inst.source) {
    case InstanceSource::kRegistered: return {inst.admission, false};
    case InstanceSource::kReplica: return {inst.admission, inst.replica_of_operator_entry};
    default: return {config::AdmissionClass::kOpen, true};  // static, admin (Kubernetes: not published)
  }
}

proto::Registration replica_registration(const Instance& inst) {
  proto::Registration reg;
  static_cast<proto::NodeSpec&>(reg) = inst;
  reg.format = proto::RegistrationFormat::kPdrouter;
  reg.schema_version = 1;
  reg.instance_id = inst.instance_id;
  reg.epoch = inst.epoch;
  reg.draining = inst.node_draining || inst.operator_drain;
  // A registry entry without a connector is one that has none (a `connector: none` node, or a
  // registration that named none and gave no zmq_address to infer one from): said explicitly, or
  // another replica would infer one from its zmq_address and pair it.
  reg.no_connector = inst.connector == proto::Connector::kUnknown;
  return reg;
}

std::string replica_key(const std::string& prefix, const std::string& replica_id, const std::string& node_key) {
  return prefix + "nodes/" + replica_id + "/" + node_key;
}

bool parse_replica_key(const std::string& prefix, std::string_view key, std::string* replica_id,
                       std::string* node_key) {
  const std::string head = prefix + "nodes/";
  if (key.size() <= head.size() || key.substr(0, head.size()) != head) return false;
  key.remove_prefix(head.size());
  const size_t slash = key.find('/');
  if (slash == 0 || slash == std::string_view::npos || slash + 1 == key.size()) return false;
  *replica_id = std::string(key.substr(0, slash));
  *node_key = std::string(key.substr(slash + 1));
  return true;
}

namespace {

struct RemoteEntry {
  int64_t mod_revision = 0;
  proto::Registration reg;
  discovery::ReplicaOrigin origin;
};
// node key -> replica id -> its entry
using RemoteMap = std::map<std::string, std::map<std::string, RemoteEntry>>;

// Rank of an origin for the weaker-sender rule: the admission classes in order, the operator's
// entries above them all.
int rank(const discovery::ReplicaOrigin& o) {
  return o.operator_entry ? static_cast<int>(config::kAdmissionClasses) : static_cast<int>(o.admission);
}

// Of the replicas' entries for one node, the one from the strongest sender (a weaker sender on
// another replica must not win by writing last), the newest among equals; or none.
std::optional<RemoteEntry> effective(const RemoteMap& remote, const std::string& node) {
  auto it = remote.find(node);
  if (it == remote.end() || it->second.empty()) return std::nullopt;
  const RemoteEntry* best = nullptr;
  for (const auto& [replica, entry] : it->second) {
    if (best == nullptr || rank(entry.origin) > rank(best->origin) ||
        (rank(entry.origin) == rank(best->origin) && entry.mod_revision > best->mod_revision)) {
      best = &entry;
    }
  }
  return *best;
}

// A change for the registry: upsert (entry set) or remove.
struct Change {
  std::string node;
  std::optional<RemoteEntry> entry;
};

}  // namespace

class RegistryReplicator::Impl {
 public:
  Impl(RegistryReplicator& owner) : owner_(owner), status_(owner.status_), options_(owner.options_) {}

  ~Impl() { loop_.stop(); }  // before the members its stop handler uses go

  Status start() {
    return loop_.start(
        [this] {
          scan_timer_ = &loop_.timer("scan", [this] {
            scan();
            drain_conversations();
          });
          keepalive_timer_ = &loop_.timer("keepalive", [this] { keepalive(); });
          retry_timer_ = &loop_.timer("retry", [this] { connect(); });
          stop_timer_ = &loop_.timer("stop", [this] { finish_stop(); });
          client_ = std::make_unique<EtcdClient>(loop_.loop(), options_.etcd);
          connect();
          scan_timer_->start(options_.scan_interval, options_.scan_interval);
        },
        [this] { begin_stop(); });
  }

  void stop() { loop_.stop(); }

  std::string last_error() const {
    std::lock_guard<std::mutex> lock(error_mutex_);
    return last_error_;
  }

  std::string last_bad_entry() const {
    std::lock_guard<std::mutex> lock(error_mutex_);
    return last_bad_entry_;
  }

  // Owner's thread, once, after start().
  ConversationFeed* attach(const RegistryReplicator::FeedFactory& make) {
    if (feed_owned_) return nullptr;
    feed_owned_ = make(status_, [this] { wake_conversations(); });
    if (!feed_owned_) return nullptr;
    mirror_.store(feed_owned_.get(), std::memory_order_release);
    wake_conversations();
    return feed_owned_.get();
  }

 private:
  // Any thread: conversation operations were queued, or the feed attached. One wake-up at a time
  // is posted; one asked for while it runs posts the next.
  void wake_conversations() {
    if (conv_wake_posted_.exchange(true, std::memory_order_acq_rel)) return;
    loop_.post([this] {
      conv_wake_posted_.store(false, std::memory_order_release);
      on_conversations_wake();
    });
  }

  // --- connection and resync ---

  void connect() {
    const uint64_t gen = ++generation_;
    if (lease_ != 0) return sync_range(gen);
    client_->lease_grant(options_.lease_ttl.count(), [this, gen](const Status& st, const proto::EtcdLeaseAnswer& l) {
      if (gen != generation_) return;
      if (!st) return fail(gen, "lease grant: " + st.message());
      lease_ = l.id;
      status_.lease_grants.fetch_add(1, std::memory_order_relaxed);
      sync_range(gen);
    });
  }

  void sync_range(uint64_t gen) {
    client_->range_prefix(options_.prefix + "nodes/", [this, gen](const Status& st, const proto::EtcdRangeAnswer& r) {
      if (gen != generation_) return;
      if (!st) return fail(gen, "range: " + st.message());
      RemoteMap fresh;
      written_.clear();
      std::vector<std::string> own_stale;
      for (size_t i = 0; i < r.skipped; ++i) bad_entry("range", "a key over its limit or not base64");
      for (const auto& kv : r.kvs) {
        std::string replica, node;
        if (!parse_replica_key(options_.prefix, kv.key, &replica, &node)) {
          bad_entry(kv.key, "not <prefix>nodes/<replica id>/<node>");
          continue;
        }
        if (replica == options_.replica_id) {
          // Ours from before: kept only if it rides on the current lease (else it dies with
          // the old one and is written again).
          if (kv.lease == lease_) {
            written_[node] = kv.value;
          } else {
            own_stale.push_back(kv.key);
          }
          continue;
        }
        RemoteEntry entry;
        if (!decode_value(kv, &entry)) continue;
        entry.mod_revision = kv.mod_revision;
        fresh[node][replica] = std::move(entry);
      }
      std::vector<Change> changes;
      for (const auto& [node, replicas] : remote_) {
        if (!fresh.contains(node)) changes.push_back({node, std::nullopt});
      }
      for (const auto& [node, replicas] : fresh) changes.push_back({node, effective(fresh, node)});
      remote_ = std::move(fresh);
      apply(std::move(changes));
      for (const std::string& key : own_stale) {
        client_->delete_key(key, [](const Status&, const proto::EtcdAnswer&) {});
      }
      status_.resyncs.fetch_add(1, std::memory_order_relaxed);
      start_watch(gen, r.answer.revision + 1);
      synced_gen_ = gen;
      if (mirror() != nullptr) sync_conversations(gen);
    });
  }

  // --- multi-turn conversation entries (conversation_feed.h) ---

  ConversationFeed* mirror() const { return mirror_.load(std::memory_order_acquire); }

  void sync_conversations(uint64_t gen) {
    conv_gen_ = gen;
    client_->range_prefix(
        proto::etcd_conversations_prefix(options_.prefix), [this, gen](const Status& st, const proto::EtcdRangeAnswer& r) {
          if (gen != generation_) return;
          if (!st) {
            if (st.code() == StatusCode::kIoError) return fail(gen, "conversations range: " + st.message());
            // An answer pdrouter refuses (too large, say): the entries stored until now are not
            // mirrored; the registry stays in sync and new entries still arrive.
            status_.conversation_failures.fetch_add(1, std::memory_order_relaxed);
            pdr::log::warn("etcd registry: conversations range refused ({}); mirroring new entries only", st.message());
            return start_conversation_watch(gen, 0);
          }
          mirror()->resync(r.kvs, ConversationFeed::WallClock::now(), ConversationFeed::Clock::now());
          start_conversation_watch(gen, r.answer.revision + 1);
        });
  }

  void start_conversation_watch(uint64_t gen, int64_t from) {
    conv_watch_ = client_->watch_prefix(
        proto::etcd_conversations_prefix(options_.prefix), from,
        [this, gen](const proto::EtcdWatchAnswer& a) {
          if (gen != generation_) return;
          if (a.canceled) {
            return fail(gen, "conversations watch canceled (compacted at " + std::to_string(a.compact_revision) + ")");
          }
          status_.watch_events.fetch_add(a.events.size(), std::memory_order_relaxed);
          mirror()->apply(a.events, ConversationFeed::WallClock::now(), ConversationFeed::Clock::now());
        },
        [this, gen](const Status& st) {
          if (gen != generation_) return;
          fail(gen, "conversations watch: " + st.message());
        });
  }

  // A lease usable for a put whose entry must live `seconds`: granted less than a rotation
  // period ago with a TTL of (its cover + that period), so it outlives every entry put on it.
  static int64_t rotation_seconds(int64_t cover) { return std::clamp<int64_t>(cover, 1, 60); }
  bool conversation_lease_fits(int64_t seconds) const {
    return conv_lease_ != 0 && seconds <= conv_lease_cover_ &&
           Clock::now() - conv_lease_granted_at_ < std::chrono::seconds(rotation_seconds(conv_lease_cover_));
  }

  void grant_conversation_lease(int64_t cover) {
    conv_granting_ = true;
    const auto asked_at = Clock::now();  // before etcd starts the TTL: on the safe side
    client_->lease_grant(cover + rotation_seconds(cover),
                         [this, cover, asked_at](const Status& st, const proto::EtcdLeaseAnswer& l) {
                           conv_granting_ = false;
                           if (stopping_) return;
                           if (!st) {
                             // The puts waiting for it are not shared (counted); later ones ask again.
                             status_.conversation_failures.fetch_add(1, std::memory_order_relaxed);
                             drop_pending(/*puts_only=*/true);
                             return drain_conversations();
                           }
                           conv_lease_ = l.id;
                           conv_lease_cover_ = cover;
                           conv_lease_granted_at_ = asked_at;
                           drain_conversations();
                         });
  }

  void drop_pending(bool puts_only) {
    for (auto it = conv_pending_.begin(); it != conv_pending_.end();) {
      if (puts_only && it->is_delete) {
        ++it;
        continue;
      }
      status_.conversation_failures.fetch_add(1, std::memory_order_relaxed);
      it = conv_pending_.erase(it);
    }
  }

  // Starts the queued puts and deletes that fit under the in-flight cap.
  void drain_conversations() {
    ConversationFeed* m = mirror();
    if (m == nullptr || stopping_) return;
    if (!status_.reachable.load(std::memory_order_relaxed)) {
      // Never queued for later: a request's entry is worth little once its turn is over.
      m->drop_queued();
      drop_pending(/*puts_only=*/false);
      return;
    }
    if (conv_pending_.size() < kMaxReplicatorInFlight) {
      for (auto& op : m->pop(kMaxReplicatorInFlight - conv_pending_.size())) conv_pending_.push_back(std::move(op));
    }
    while (!conv_pending_.empty() && in_flight_ < kMaxReplicatorInFlight) {
      ConversationOp& op = conv_pending_.front();
      // One operation per key at a time, in order: a take's delete and the put of the turn
      // after it must reach etcd in that order (else the put is lost and every replica's watch
      // ends with the delete). The rest waits until that one is answered.
      if (conv_keys_in_flight_.contains(op.key)) return;
      if (op.is_delete) {
        begin_call();
        conv_keys_in_flight_.insert(op.key);
        m->delete_sent(op.key);
        client_->delete_key(op.key, [this, key = op.key](const Status& st, const proto::EtcdAnswer&) {
          end_call();
          conv_keys_in_flight_.erase(key);
          (st ? status_.conversation_deletes : status_.conversation_failures).fetch_add(1, std::memory_order_relaxed);
          drain_conversations();
        });
      } else {
        if (!conversation_lease_fits(op.lease_seconds)) {
          if (!conv_granting_) grant_conversation_lease(op.lease_seconds);
          return;  // the rest after the grant
        }
        begin_call();
        conv_keys_in_flight_.insert(op.key);
        m->put_sent(op.key);
        client_->put(op.key, op.value, conv_lease_, [this, key = op.key, lease = conv_lease_](
                                                        const Status& st, const proto::EtcdAnswer& answer) {
          end_call();
          conv_keys_in_flight_.erase(key);
          if (ConversationFeed* mirror = this->mirror()) mirror->put_answered(key, st.is_ok(), answer.revision);
          if (st) {
            status_.conversation_puts.fetch_add(1, std::memory_order_relaxed);
          } else {
            status_.conversation_failures.fetch_add(1, std::memory_order_relaxed);
            // etcd's gRPC NotFound ("requested lease not found"): a new lease for the next put.
            if (lease == conv_lease_ && answer.is_error && answer.grpc_code == kGrpcNotFound) conv_lease_ = 0;
          }
          drain_conversations();
        });
      }
      conv_pending_.pop_front();
    }
  }

  void on_conversations_wake() {
    if (stopping_ || mirror() == nullptr) return;
    // Attached after this generation's resync: range and watch the conversations now.
    if (synced_gen_ == generation_ && conv_gen_ != generation_) sync_conversations(generation_);
    drain_conversations();
  }

  void start_watch(uint64_t gen, int64_t from) {
    watch_ = client_->watch_prefix(
        options_.prefix + "nodes/", from,
        [this, gen](const proto::EtcdWatchAnswer& a) {
          if (gen != generation_) return;
          if (a.canceled) return fail(gen, "watch canceled (compacted at " + std::to_string(a.compact_revision) + ")");
          if (a.created) {
            status_.reachable.store(true, std::memory_order_relaxed);
            retry_delay_ = options_.retry_interval;
            status_.retry_delay_ms.store(0, std::memory_order_relaxed);
            force_scan_ = true;
            const uint64_t every = std::max<uint64_t>(1000, options_.lease_ttl.count() * 1000 / 3);
            keepalive_timer_->start(std::chrono::milliseconds(every), std::chrono::milliseconds(every));
            // Renewed at once too: every failure stops the keepalive timer and every resync
            // restarts it, so when failures come more often than every lease_ttl / 3 (puts
            // timing out on an overloaded etcd) no keepalive would ever be sent and the lease
            // would expire under a replica that is in sync (seen at 10,000 nodes with a 60 s
            // lease, bench/etcd/RESULTS.md).
            keepalive();
            pdr::log::info("etcd registry: in sync with {} (replica {}, lease {})", client_->endpoint().to_string(),
                         options_.replica_id, lease_);
          }
          on_events(a);
        },
        [this, gen](const Status& st) {
          if (gen != generation_) return;
          fail(gen, "watch: " + st.message());
        });
  }

  void fail(uint64_t gen, const std::string& why) {
    if (gen != generation_) return;
    ++generation_;  // every callback of this attempt is now stale
    status_.failures.fetch_add(1, std::memory_order_relaxed);
    {
      // Before `reachable` goes false, so a /status that sees it unreachable also sees why.
      std::lock_guard<std::mutex> lock(error_mutex_);
      last_error_ = why;
    }
    if (status_.reachable.exchange(false, std::memory_order_relaxed)) {
      pdr::log::warn("etcd registry: etcd unreachable ({}); routing on the last view, retrying", why);
    }
    if (watch_) watch_->cancel();
    watch_.reset();
    if (conv_watch_) conv_watch_->cancel();
    conv_watch_.reset();
    keepalive_timer_->stop();
    if (stopping_) return;
    // Each failure in a row waits twice as long (each retry may download the whole prefix again);
    // the first wait after being in sync is retry_interval.
    const std::chrono::milliseconds delay = retry_delay_;
    retry_delay_ = std::min(retry_delay_ * 2, std::max(options_.retry_interval, options_.max_retry_interval));
    status_.retry_delay_ms.store(static_cast<uint64_t>(delay.count()), std::memory_order_relaxed);
    retry_timer_->start(delay);
  }

  // --- the other replicas' entries ---

  // The entry another replica holds under kv's key, or false (counted) for a value refused by the
  // codec (over its limit, proto/etcd_json.h) or that is not a registry entry.
  bool decode_value(const proto::EtcdKeyValue& kv, RemoteEntry* out) {
    if (!kv.refused.empty()) {
      bad_entry(kv.key, kv.refused);
      return false;
    }
    proto::EtcdRegistryEntry entry;
    if (Status st = proto::decode_etcd_registry_entry(proto::as_bytes(kv.value), proto::DecodeLimits{}, &entry); !st) {
      bad_entry(kv.key, st.to_string());
      return false;
    }
    out->reg = std::move(entry.registration);
    out->origin = discovery::parse_replica_origin(entry.admission);
    return true;
  }

  void bad_entry(std::string_view key, std::string_view why) {
    status_.bad_entries.fetch_add(1, std::memory_order_relaxed);
    std::string text = std::string(key.substr(0, 256)) + ": " + std::string(why.substr(0, 256));
    if (bad_log_.allow(Clock::now())) pdr::log::warn("etcd registry: entry refused, skipped: {}", text);
    std::lock_guard<std::mutex> lock(error_mutex_);
    last_bad_entry_ = std::move(text);
  }

  void on_events(const proto::EtcdWatchAnswer& answer) {
    std::vector<Change> changes;
    for (size_t i = 0; i < answer.skipped; ++i) bad_entry("watch", "a key over its limit or not base64");
    for (const auto& e : answer.events) {
      status_.watch_events.fetch_add(1, std::memory_order_relaxed);
      std::string replica, node;
      if (!parse_replica_key(options_.prefix, e.kv.key, &replica, &node)) {
        bad_entry(e.kv.key, "not <prefix>nodes/<replica id>/<node>");
        continue;
      }
      if (replica == options_.replica_id) continue;
      RemoteEntry entry;
      // A put of a bad value replaces what the key held: that replica's entry is gone, as after
      // a resync (whose range skips the key too).
      if (!e.is_delete && decode_value(e.kv, &entry)) {
        entry.mod_revision = e.kv.mod_revision;
        remote_[node][replica] = std::move(entry);
      } else {
        auto it = remote_.find(node);
        if (it == remote_.end() || !it->second.contains(replica)) continue;
        it->second.erase(replica);
        if (it->second.empty()) remote_.erase(it);
      }
      changes.push_back({node, effective(remote_, node)});
    }
    apply(std::move(changes));
  }

  void apply(std::vector<Change> changes) {
    status_.replica_entries.store(remote_.size(), std::memory_order_relaxed);
    if (changes.empty()) return;
    owner_.discovery_.post([changes = std::move(changes)](discovery::Registry& registry) {
      const auto now = Clock::now();
      for (const Change& c : changes) {
        if (c.entry) {
          (void)registry.upsert_replica(c.entry->reg, c.entry->origin, now);
        } else {
          (void)registry.remove_replica(c.node);
        }
      }
    });
  }

  // --- this replica's entries ---

  void scan() {
    if (!status_.reachable.load(std::memory_order_relaxed) || lease_ == 0) return;
    const uint64_t version = owner_.snapshots_.version();
    if (version == seen_version_ && !force_scan_) return;
    seen_version_ = version;
    force_scan_ = false;
    const auto snapshot = owner_.snapshots_.load();
    std::map<std::string, std::string> desired;
    for (const auto& inst : snapshot->instances) {
      // Pods found through Kubernetes: every replica watches the API server itself.
      if (inst->source == InstanceSource::kReplica || inst->source == InstanceSource::kKubernetes ||
          inst->state == InstanceState::kExpired) {
        continue;
      }
      desired.emplace(inst->key, proto::encode_etcd_registry_entry(replica_registration(*inst),
                                                                   discovery::to_string(replica_origin(*inst))));
    }
    const uint64_t gen = generation_;
    for (auto& [node, value] : desired) {
      auto it = written_.find(node);
      if (it != written_.end() && it->second == value) continue;
      if (in_flight_ >= kMaxReplicatorInFlight) {
        force_scan_ = true;  // the rest on the next scan
        break;
      }
      written_[node] = value;
      status_.puts.fetch_add(1, std::memory_order_relaxed);
      begin_call();
      client_->put(replica_key(options_.prefix, options_.replica_id, node), value, lease_,
                   [this, gen, node](const Status& st, const proto::EtcdAnswer& answer) {
                     end_call();
                     if (st) return;
                     // The lease expired or was revoked under us: a new one, or every resync
                     // would put on the dead lease again and never recover. etcd answers
                     // {"error":"etcdserver: requested lease not found","code":5} (gRPC
                     // NotFound; HTTP 404 from the gateway): the code, not the text, says so.
                     if (gen == generation_ && answer.is_error && answer.grpc_code == kGrpcNotFound) lose_lease();
                     written_.erase(node);  // written again after the resync
                     fail(gen, "put: " + st.message());
                   });
    }
    for (auto it = written_.begin(); it != written_.end();) {
      if (desired.contains(it->first)) {
        ++it;
        continue;
      }
      if (in_flight_ >= kMaxReplicatorInFlight) {
        force_scan_ = true;
        break;
      }
      status_.deletes.fetch_add(1, std::memory_order_relaxed);
      begin_call();
      client_->delete_key(replica_key(options_.prefix, options_.replica_id, it->first),
                          [this, gen](const Status& st, const proto::EtcdAnswer&) {
                            end_call();
                            if (!st) fail(gen, "delete: " + st.message());
                          });
      it = written_.erase(it);
    }
  }

  void keepalive() {
    const uint64_t gen = generation_;
    client_->lease_keepalive(lease_, [this, gen](const Status& st, const proto::EtcdLeaseAnswer&) {
      if (gen != generation_) return;
      if (st) {
        status_.keepalives.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      if (st.code() == StatusCode::kNotFound) lose_lease();  // gone: a new lease, everything rewritten
      fail(gen, "lease keepalive: " + st.message());
    });
  }

  void begin_call() {
    ++in_flight_;
    status_.in_flight.store(in_flight_, std::memory_order_relaxed);
    if (in_flight_ > status_.in_flight_max.load(std::memory_order_relaxed)) {
      status_.in_flight_max.store(in_flight_, std::memory_order_relaxed);
    }
  }
  void end_call() {
    --in_flight_;
    status_.in_flight.store(in_flight_, std::memory_order_relaxed);
  }

  void lose_lease() {
    if (lease_ == 0) return;
    pdr::log::warn("etcd registry: lease {} is gone (expired or revoked); a new lease, every entry written again",
                   lease_);
    lease_ = 0;
    status_.leases_lost.fetch_add(1, std::memory_order_relaxed);
  }

  // --- shutdown ---

  void begin_stop() {
    stopping_ = true;
    // No wake after this returns. The conversations' lease is not revoked: the entries stay
    // usable on the other replicas until they expire.
    if (ConversationFeed* m = mirror()) m->close();
    scan_timer_->stop();
    retry_timer_->stop();
    keepalive_timer_->stop();
    if (watch_) watch_->cancel();
    watch_.reset();
    if (conv_watch_) conv_watch_->cancel();
    conv_watch_.reset();
    if (lease_ != 0 && status_.reachable.load(std::memory_order_relaxed)) {
      client_->lease_revoke(lease_, [this](const Status&, const proto::EtcdAnswer&) { finish_stop(); });
      stop_timer_->start(std::chrono::milliseconds(1000));
      return;
    }
    finish_stop();
  }

  void finish_stop() {
    if (closed_) return;
    closed_ = true;
    ++generation_;
    client_.reset();  // closes its connections; no callback fires after this
    loop_.quit();     // and every timer
  }

  RegistryReplicator& owner_;
  ReplicatorStatus& status_;
  const RegistryReplicatorOptions& options_;
  LoopThread loop_{"etcd registry"};
  LoopThread::Timer* scan_timer_ = nullptr;
  LoopThread::Timer* keepalive_timer_ = nullptr;
  LoopThread::Timer* retry_timer_ = nullptr;
  LoopThread::Timer* stop_timer_ = nullptr;
  std::atomic<bool> conv_wake_posted_{false};  // a wake_conversations() not yet run
  std::unique_ptr<EtcdClient> client_;
  std::shared_ptr<EtcdWatch> watch_;
  int64_t lease_ = 0;
  uint64_t generation_ = 0;
  uint64_t seen_version_ = 0;
  bool force_scan_ = true;
  bool stopping_ = false;
  bool closed_ = false;
  std::map<std::string, std::string> written_;  // node key -> value this replica wrote
  RemoteMap remote_;
  // Puts and deletes in flight (registry entries and conversations together), at most
  // kMaxReplicatorInFlight (registry_replicator.h): a burst of thousands of registrations
  // would otherwise start thousands of requests at once; on a loaded etcd some time out, each
  // failure resyncs and rewrites every entry, and the replica never catches up (seen at 10,000
  // nodes, bench/etcd/RESULTS.md). What does not fit waits for the next scan.
  size_t in_flight_ = 0;
  // Conversations (conversation_feed.h): the feed (set once by attach()), the generation whose
  // resync finished and the one whose conversations were ranged, their watch, the operations
  // popped but not started, and the current conversations' lease.
  std::unique_ptr<ConversationFeed> feed_owned_;
  std::atomic<ConversationFeed*> mirror_{nullptr};
  uint64_t synced_gen_ = 0;
  uint64_t conv_gen_ = 0;
  std::shared_ptr<EtcdWatch> conv_watch_;
  std::deque<ConversationOp> conv_pending_;
  std::set<std::string> conv_keys_in_flight_;
  int64_t conv_lease_ = 0;
  int64_t conv_lease_cover_ = 0;
  Clock::time_point conv_lease_granted_at_{};
  bool conv_granting_ = false;
  mutable std::mutex error_mutex_;
  std::string last_error_;
  std::string last_bad_entry_;
  LogLimiter bad_log_{"etcd registry"};
  std::chrono::milliseconds retry_delay_{options_.retry_interval};  // the next failure's wait
};

RegistryReplicator::RegistryReplicator(SnapshotCell<discovery::RegistrySnapshot>& snapshots,
                                       discovery::DiscoveryService& discovery)
    : snapshots_(snapshots), discovery_(discovery) {}

RegistryReplicator::~RegistryReplicator() { stop(); }

Status RegistryReplicator::start(RegistryReplicatorOptions options) {
  if (options.etcd.endpoints.empty()) return Status(StatusCode::kInvalidValue, "etcd registry: no endpoint");
  if (options.replica_id.empty() || options.replica_id.find('/') != std::string::npos) {
    return Status(StatusCode::kInvalidValue, "etcd registry: replica id empty or with '/'");
  }
  options_ = std::move(options);
  impl_ = std::make_unique<Impl>(*this);
  return impl_->start();
}

void RegistryReplicator::stop() {
  // impl_ stays until destruction: /status may still read last_error() while the HTTP workers
  // drain after stop().
  if (impl_) impl_->stop();
}

ConversationFeed* RegistryReplicator::mirror_conversations(const FeedFactory& make) {
  return impl_ ? impl_->attach(make) : nullptr;
}

std::string RegistryReplicator::last_error() const { return impl_ ? impl_->last_error() : std::string(); }

std::string RegistryReplicator::last_bad_entry() const { return impl_ ? impl_->last_bad_entry() : std::string(); }

}  // namespace pdr::discovery::sources::etcd
