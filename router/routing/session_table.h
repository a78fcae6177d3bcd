// Session affinity's bindings (topology session_affinity:, session_affinity.h): per session, the
// prefill and decode node keys its last turn was routed to.
//
// A session is the pair (binding, id): the binding is the client's (conversation_binding.h), so
// a client naming another client's session id finds nothing and binds its own beside it; ids are
// matched exactly (never by prefix). slot_key() is that pair as one string.
//
// Bounded: at most max_sessions entries (the least recently used go first) and each entry's
// strings bounded by the caller (ids by session_affinity.max_id_bytes, node keys by the
// registry's), so memory is bounded too. An entry not used for idle_ttl is never handed out and
// is dropped when found or when it reaches the old end of its shard's order.
//
// Hashing: session ids come from clients, so the map hashes slot keys with XXH64 seeded from the
// process's secret (proto/base/keyed_hash.h) rather than std::hash's fixed seed, and each shard
// holds at most its share of max_sessions: a chosen set of ids cannot lengthen a bucket chain
// beyond that.
//
// Replication (registry.backend: etcd): with a Replication attached, each local bind() is also
// handed to it, outside the lock; bindings from other replicas arrive through mirror(), which is
// not handed back.
//
// Threading: thread-safe; kShards shards, each under its own mutex, so HTTP workers rarely meet.
// find() and bind() are O(1) plus the evictions they make; bind() allocates only the entry.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace pdr::router::routing {

class SessionTable {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kShards = 16;

  struct Key {
    std::string_view binding;  // conversation_binding.h: "" anonymous, else a digest (< 256 bytes)
    std::string_view id;       // the client's session id, validated by the caller
  };
  struct Binding {
    std::string prefill_key;  // instance keys (host:port of their HTTP address)
    std::string decode_key;
  };
  struct Limits {
    size_t max_sessions = 100'000;
    std::chrono::milliseconds idle_ttl{1'800'000};
  };
  struct Stats {
    uint64_t entries = 0;
    uint64_t evicted = 0;  // dropped by max_sessions
    uint64_t expired = 0;  // dropped after idle_ttl without a turn
    uint64_t mirrored = 0;  // bindings taken from other replicas (mirror())
  };

  class Replication {
   public:
    virtual ~Replication() = default;
    // A local bind() stored `binding` for the session; called on request threads: must not block.
    virtual void bound(const Key& key, const Binding& binding, std::chrono::milliseconds idle_ttl) = 0;
  };

  // The session's binding when it has one younger than idle_ttl (then it becomes the most
  // recently used); nullopt otherwise (an expired one is dropped).
  std::optional<Binding> find(const Key& key, Clock::time_point now, const Limits& limits);
  // Binds (or rebinds) the session to the pair, then evicts over max_sessions and expired entries
  // at the old end. Handed to the replication.
  void bind(const Key& key, std::string_view prefill_key, std::string_view decode_key, Clock::time_point now,
            const Limits& limits);
  // A session kept on its binding (no bind()): hands the binding to the replication again when
  // it last did more than half of idle_ttl ago, so that the other replicas' copies (and etcd's
  // expiry) follow a session that stays active. No-op without a replication or a binding.
  void refresh(const Key& key, Clock::time_point now, const Limits& limits);
  // A binding another replica made (stored as used at `now`): like bind(), not handed back.
  void mirror(const Key& key, std::string_view prefill_key, std::string_view decode_key, Clock::time_point now,
              const Limits& limits);
  void set_replication(Replication* replication) { replication_.store(replication, std::memory_order_release); }

  Stats stats() const;
  // The binding's length (one byte), the binding, the id.
  static std::string slot_key(const Key& key);
  static void slot_key_into(const Key& key, std::string* out);

 private:
  struct Entry {
    std::string slot;  // slot_key(): the map's key points into it
    Binding binding;
    Clock::time_point used_at;
    Clock::time_point shared_at;  // last handed to the replication (or mirrored)
  };
  struct SlotHash {
    size_t operator()(std::string_view slot) const;
  };
  struct Shard {
    mutable std::mutex mutex;
    std::list<Entry> order;  // most recently used first
    std::unordered_map<std::string_view, std::list<Entry>::iterator, SlotHash> by_slot;
  };

  Shard& shard_of(std::string_view slot);
  void store(const Key& key, std::string_view prefill_key, std::string_view decode_key, Clock::time_point now,
             const Limits& limits);

  std::array<Shard, kShards> shards_;
  std::atomic<uint64_t> entries_{0}, evicted_{0}, expired_{0}, mirrored_{0};
  std::atomic<Replication*> replication_{nullptr};
};

}  // namespace pdr::router::routing
