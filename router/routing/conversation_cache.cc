#include "router/routing/conversation_cache.h"

#include <iterator>

namespace pdr::router::routing {

namespace {

// Bytes an entry is charged: its slot key twice (map and order list), its id once more (the
// per-id count) and its strings.
size_t charge(std::string_view slot_key, std::string_view id, const ConversationCache::Entry& e) {
  return 2 * slot_key.size() + id.size() + e.decode_key.size() + e.prefill_params.size();
}

// The conversation_id part of a slot key.
std::string_view id_of(std::string_view slot_key) {
  return slot_key.substr(1 + static_cast<uint8_t>(slot_key.front()));
}

}  // namespace

std::string ConversationCache::slot_key(const Key& key) {
  std::string out;
  out.reserve(1 + key.binding.size() + key.id.size());
  // Bindings are digests (conversation_binding.h): their length fits the byte.
  out += static_cast<char>(static_cast<uint8_t>(key.binding.size()));
  out += key.binding;
  out += key.id;
  return out;
}

void ConversationCache::erase_locked(std::unordered_map<std::string, Slot>::iterator it) {
  bytes_ -= it->second.bytes;
  if (it->second.entry.remote) --remote_;
  if (auto id = ids_.find(std::string(id_of(it->first))); id != ids_.end() && --id->second == 0) ids_.erase(id);
  order_.erase(it->second.position);
  slots_.erase(it);
}

void ConversationCache::evict_locked(Clock::time_point now, const Limits& limits) {
  while (!order_.empty()) {
    auto it = slots_.find(order_.front());
    const bool expired = now - it->second.stored_at >= limits.ttl;
    if (!expired && slots_.size() <= limits.max_entries && bytes_ <= limits.max_bytes) return;
    (expired ? stats_.expired : stats_.evicted)++;
    erase_locked(it);
  }
}

bool ConversationCache::insert_locked(const Key& key, Entry entry, Clock::time_point stored_at,
                                      Clock::time_point now, const Limits& limits) {
  std::string slot = slot_key(key);
  const size_t bytes = charge(slot, key.id, entry);
  if (auto it = slots_.find(slot); it != slots_.end()) erase_locked(it);
  if (bytes > limits.max_bytes) {
    stats_.evicted++;
    return false;
  }
  const bool remote = entry.remote;
  order_.emplace_back(slot);
  Slot s{std::move(entry), stored_at, std::prev(order_.end()), bytes};
  slots_.emplace(slot, std::move(s));
  ++ids_[std::string(key.id)];
  bytes_ += bytes;
  if (remote) ++remote_;
  evict_locked(now, limits);
  return slots_.contains(slot);
}

void ConversationCache::put(const Key& key, Entry entry, Clock::time_point now, const Limits& limits) {
  entry.remote = false;
  Replication* replication = replication_.load(std::memory_order_acquire);
  std::optional<Entry> shared;
  if (replication != nullptr) shared = entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!insert_locked(key, std::move(entry), now, now, limits)) return;
    stats_.stored++;
  }
  // Outside the lock: the replication queues it for its own thread.
  if (shared) replication->stored(key, *shared, limits.ttl);
}

bool ConversationCache::mirror(const Key& key, Entry entry, Clock::time_point stored_at, Clock::time_point now,
                               const Limits& limits) {
  entry.remote = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (now - stored_at >= limits.ttl) return false;
  return insert_locked(key, std::move(entry), stored_at, now, limits);
}

bool ConversationCache::restore(const Key& key, Entry entry, Clock::time_point stored_at, Clock::time_point now,
                                const Limits& limits) {
  entry.remote = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (slots_.contains(slot_key(key))) return true;
  if (now - stored_at >= limits.ttl) return false;
  return insert_locked(key, std::move(entry), stored_at, now, limits);
}

bool ConversationCache::forget(const Key& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(slot_key(key));
  if (it == slots_.end()) return false;
  erase_locked(it);
  return true;
}

size_t ConversationCache::drop_remote_except(const std::unordered_set<std::string>& keep) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t dropped = 0;
  for (auto it = slots_.begin(); it != slots_.end();) {
    auto next = std::next(it);
    if (it->second.entry.remote && !keep.contains(it->first)) {
      erase_locked(it);
      ++dropped;
    }
    it = next;
  }
  return dropped;
}

std::optional<ConversationCache::Entry> ConversationCache::take(const Key& key, Clock::time_point now,
                                                                std::chrono::milliseconds ttl, bool* other_binding) {
  if (other_binding != nullptr) *other_binding = false;
  std::optional<Entry> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(slot_key(key));
    if (it == slots_.end()) {
      stats_.missing++;
      if (ids_.contains(std::string(key.id))) {
        stats_.other_binding++;
        if (other_binding != nullptr) *other_binding = true;
      }
      return std::nullopt;
    }
    if (now - it->second.stored_at >= ttl) {
      stats_.expired++;
      erase_locked(it);
      return std::nullopt;
    }
    out = std::move(it->second.entry);
    erase_locked(it);
    stats_.taken++;
  }
  if (Replication* replication = replication_.load(std::memory_order_acquire)) replication->taken(key);
  return out;
}

ConversationCache::Stats ConversationCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.entries = slots_.size();
  s.bytes = bytes_;
  s.remote_entries = remote_;
  return s;
}

}  // namespace pdr::router::routing
