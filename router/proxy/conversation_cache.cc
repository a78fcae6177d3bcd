#include "router/proxy/conversation_cache.h"

#include <iterator>

namespace pdr::router::proxy {

namespace {

// Bytes an entry is charged: its key twice (map and order list) and its strings.
size_t charge(std::string_view id, const ConversationCache::Entry& e) {
  return 2 * id.size() + e.decode_key.size() + e.prefill_params.size();
}

}  // namespace

void ConversationCache::erase_locked(std::unordered_map<std::string, Slot>::iterator it) {
  bytes_ -= it->second.bytes;
  if (it->second.entry.remote) --remote_;
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

bool ConversationCache::insert_locked(std::string_view conversation_id, Entry entry, Clock::time_point stored_at,
                                      Clock::time_point now, const Limits& limits) {
  const size_t bytes = charge(conversation_id, entry);
  if (auto it = slots_.find(std::string(conversation_id)); it != slots_.end()) erase_locked(it);
  if (bytes > limits.max_bytes) {
    stats_.evicted++;
    return false;
  }
  const bool remote = entry.remote;
  order_.emplace_back(conversation_id);
  Slot slot{std::move(entry), stored_at, std::prev(order_.end()), bytes};
  slots_.emplace(std::string(conversation_id), std::move(slot));
  bytes_ += bytes;
  if (remote) ++remote_;
  evict_locked(now, limits);
  return slots_.contains(std::string(conversation_id));
}

void ConversationCache::put(std::string_view conversation_id, Entry entry, Clock::time_point now,
                            const Limits& limits) {
  entry.remote = false;
  Replication* replication = replication_.load(std::memory_order_acquire);
  std::optional<Entry> shared;
  if (replication != nullptr) shared = entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!insert_locked(conversation_id, std::move(entry), now, now, limits)) return;
    stats_.stored++;
  }
  // Outside the lock: the replication queues it for its own thread.
  if (shared) replication->stored(conversation_id, *shared, limits.ttl);
}

bool ConversationCache::mirror(std::string_view conversation_id, Entry entry, Clock::time_point stored_at,
                               Clock::time_point now, const Limits& limits) {
  entry.remote = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (now - stored_at >= limits.ttl) return false;
  return insert_locked(conversation_id, std::move(entry), stored_at, now, limits);
}

bool ConversationCache::restore(std::string_view conversation_id, Entry entry, Clock::time_point stored_at,
                                Clock::time_point now, const Limits& limits) {
  entry.remote = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (slots_.contains(std::string(conversation_id))) return true;
  if (now - stored_at >= limits.ttl) return false;
  return insert_locked(conversation_id, std::move(entry), stored_at, now, limits);
}

bool ConversationCache::forget(std::string_view conversation_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = slots_.find(std::string(conversation_id));
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

std::optional<ConversationCache::Entry> ConversationCache::take(std::string_view conversation_id,
                                                                Clock::time_point now,
                                                                std::chrono::milliseconds ttl) {
  std::optional<Entry> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(std::string(conversation_id));
    if (it == slots_.end()) {
      stats_.missing++;
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
  if (Replication* replication = replication_.load(std::memory_order_acquire)) replication->taken(conversation_id);
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

}  // namespace pdr::router::proxy
