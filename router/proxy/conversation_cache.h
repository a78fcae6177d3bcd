// Multi-turn KV reuse (topology multi_turn:, NIXL with bidirectional_kv_xfer): per conversation,
// the decode that served its last turn and the kv_transfer_params that decode returned at the
// end, rewritten for the next turn's prefill (proto/multi_turn.h). The next turn takes the entry
// (single use: the decode's blocks can be pulled once) and goes to that decode.
//
// Bounded: at most `max_entries` entries and `max_bytes` of keys and params; beyond either, the
// oldest stored entries go first. An entry older than `ttl` is never handed out (vLLM frees the
// decode's blocks after decoder_kv_blocks_ttl, 480 s by default, so ttl must stay below it).
//
// Threading: thread-safe (one mutex; each call is O(1) plus the evictions it makes).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace pdr::router::proxy {

class ConversationCache {
 public:
  using Clock = std::chrono::steady_clock;

  struct Entry {
    std::string decode_key;      // the decode instance that holds the conversation's KV
    uint64_t decode_epoch = 0;   // and its epoch then: a restarted decode has lost the blocks
    std::string prefill_params;  // kv_transfer_params JSON object for the next turn's prefill
  };
  struct Stats {
    uint64_t entries = 0;
    uint64_t bytes = 0;
    uint64_t stored = 0;
    uint64_t taken = 0;    // handed to a next turn
    uint64_t missing = 0;  // a conversation_id with no entry
    uint64_t expired = 0;  // found but older than ttl
    uint64_t evicted = 0;  // dropped by max_entries / max_bytes
  };

  struct Limits {
    std::chrono::milliseconds ttl{450'000};
    size_t max_entries = 100'000;
    size_t max_bytes = 64u << 20;
  };

  // Limits come with each call (from the request's topology, so a reload applies at once).
  // Stores (or replaces) the conversation's entry, then evicts what is over the limits or
  // expired. An entry larger than max_bytes is not kept.
  void put(std::string_view conversation_id, Entry entry, Clock::time_point now, const Limits& limits);
  // Removes and returns the conversation's entry if it is younger than `ttl`.
  std::optional<Entry> take(std::string_view conversation_id, Clock::time_point now, std::chrono::milliseconds ttl);

  Stats stats() const;

 private:
  using Order = std::list<std::string>;  // conversation ids, oldest first
  struct Slot {
    Entry entry;
    Clock::time_point stored_at;
    Order::iterator position;
    size_t bytes = 0;
  };
  void erase_locked(std::unordered_map<std::string, Slot>::iterator it);
  void evict_locked(Clock::time_point now, const Limits& limits);

  mutable std::mutex mu_;
  std::unordered_map<std::string, Slot> slots_;
  Order order_;
  size_t bytes_ = 0;
  Stats stats_;
};

}  // namespace pdr::router::proxy
