// Multi-turn KV reuse (topology multi_turn:, NIXL with bidirectional_kv_xfer): per conversation,
// the decode that served its last turn and the kv_transfer_params that decode returned at the
// end, rewritten for the next turn's prefill (proto/multi_turn.h). The next turn takes the entry
// (single use: the decode's blocks can be pulled once) and goes to that decode.
//
// A conversation is the pair (binding, conversation_id) (Key): the binding is the client's
// (conversation_binding.h), so a client reusing another client's conversation_id finds no entry
// (take() tells it apart from a plain miss: another binding holds the id) and stores its own
// beside the other client's, never over it.
//
// Bounded: at most `max_entries` entries and `max_bytes` of keys and params; beyond either, the
// oldest stored entries go first. An entry older than `ttl` is never handed out (vLLM frees the
// decode's blocks after decoder_kv_blocks_ttl, 480 s by default, so ttl must stay below it).
//
// Replication (registry.backend: etcd, router/conversation_mirror.h): with a replication
// attached, every local put() and every successful take() is also handed to it, outside the lock,
// so the entries can be shared with other replicas; entries that come from other replicas are
// stored with mirror() (marked remote) and removed with forget(), neither of which is handed back.
//
// Threading: thread-safe (one mutex; each call is O(1) plus the evictions it makes, except
// drop_remote_except, O(entries)).
#pragma once

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
#include <unordered_set>

namespace pdr::router::routing {


class ConversationCache {
 public:
  using Clock = std::chrono::steady_clock;

  // Whose conversation an entry is. Views: the cache copies what it keeps.
  struct Key {
    std::string_view binding;  // conversation_binding.h: "" anonymous, else a digest (< 256 bytes)
    std::string_view id;       // the client's conversation_id
  };

  struct Entry {
    std::string decode_key;      // the decode instance that holds the conversation's KV
    uint64_t decode_epoch = 0;   // and its epoch then: a restarted decode has lost the blocks
    std::string prefill_params;  // kv_transfer_params JSON object for the next turn's prefill
    bool remote = false;         // stored by another replica (mirror())
  };

  // Where local changes go to be shared (router/conversation_mirror.h). Both calls come
  // from request threads and must not block (queue the work elsewhere).
  class Replication {
   public:
    virtual ~Replication() = default;
    // A local put() kept `entry`, valid for `ttl` from now.
    virtual void stored(const Key& key, const Entry& entry, std::chrono::milliseconds ttl) = 0;
    // take() handed out the conversation's entry (single use: gone everywhere).
    virtual void taken(const Key& key) = 0;
  };
  struct Stats {
    uint64_t entries = 0;
    uint64_t bytes = 0;
    uint64_t stored = 0;
    uint64_t taken = 0;    // handed to a next turn
    uint64_t missing = 0;  // a conversation with no entry (other_binding included)
    uint64_t other_binding = 0;  // of `missing`: the id has entries, all of other bindings
    uint64_t expired = 0;  // found but older than ttl
    uint64_t evicted = 0;  // dropped by max_entries / max_bytes
    uint64_t remote_entries = 0;  // of `entries`, mirrored from other replicas
  };

  struct Limits {
    std::chrono::milliseconds ttl{450'000};
    size_t max_entries = 100'000;
    size_t max_bytes = 64u << 20;
  };

  // Limits come with each call (from the request's topology, so a reload applies at once).
  // Stores (or replaces) the conversation's entry, then evicts what is over the limits or
  // expired. An entry larger than max_bytes is not kept.
  void put(const Key& key, Entry entry, Clock::time_point now, const Limits& limits);
  // Removes and returns the conversation's entry if it is younger than `ttl`. When there is none
  // but other bindings hold entries for the same id, *other_binding (if given) is set true
  // (else false); those entries are left as they are.
  std::optional<Entry> take(const Key& key, Clock::time_point now, std::chrono::milliseconds ttl,
                            bool* other_binding = nullptr);

  // Replication (null: none). Set before the entries are shared; `replication` outlives its use.
  void set_replication(Replication* replication) { replication_.store(replication, std::memory_order_release); }

  // An entry another replica stored (entry.remote is set here), stored at `stored_at` (the
  // caller maps the writer's wall-clock expiry onto this clock). Replaces the conversation's
  // entry, then evicts like put(). False (nothing kept) when it is already expired or larger than
  // max_bytes. Not handed to the replication. A mirrored entry stored at an older time than the
  // newest one is evicted by age only once it reaches the front of the order (take() checks
  // the age of every entry it hands out).
  bool mirror(const Key& key, Entry entry, Clock::time_point stored_at, Clock::time_point now, const Limits& limits);
  // Like mirror(), for an entry this replica's id wrote before it restarted (found in etcd under
  // its own replica id): stored as mirrored (etcd holds it, so a resync that no longer finds it
  // drops it, and a take deletes its key like any other), unless the cache already holds an
  // entry for the conversation (this process stored it: that one stays). True if the
  // conversation has an entry afterwards.
  bool restore(const Key& key, Entry entry, Clock::time_point stored_at, Clock::time_point now, const Limits& limits);
  // Removes the conversation's entry (local or remote; another replica took it). Not handed to
  // the replication. True if there was one.
  bool forget(const Key& key);
  // Removes every remote entry whose slot_key() is not in `keep` (a resync with etcd); returns
  // how many.
  size_t drop_remote_except(const std::unordered_set<std::string>& keep);
  // The cache's own text for a key: the binding's length (one byte), the binding, the id.
  static std::string slot_key(const Key& key);

  Stats stats() const;

 private:
  using Order = std::list<std::string>;  // slot keys, oldest first
  struct Slot {
    Entry entry;
    Clock::time_point stored_at;
    Order::iterator position;
    size_t bytes = 0;
  };
  void erase_locked(std::unordered_map<std::string, Slot>::iterator it);
  void evict_locked(Clock::time_point now, const Limits& limits);
  // Stores under the lock (replacing the conversation's entry); false if over max_bytes.
  bool insert_locked(const Key& key, Entry entry, Clock::time_point stored_at, Clock::time_point now,
                     const Limits& limits);

  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> slots_;  // by slot_key()
  // Entries per conversation_id, whatever their binding: tells take() a miss from an id that
  // belongs to other clients.
  std::unordered_map<std::string, uint32_t> ids_;
  Order order_;
  size_t bytes_ = 0;
  size_t remote_ = 0;
  Stats stats_;
  std::atomic<Replication*> replication_{nullptr};
};

}  // namespace pdr::router::routing
