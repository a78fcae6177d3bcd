#include "router/proxy/conversation_cache.h"

namespace pdr::router::proxy {

namespace {

// Bytes an entry is charged: its key twice (map and order list) and its strings.
size_t charge(std::string_view id, const ConversationCache::Entry& e) {
  return 2 * id.size() + e.decode_key.size() + e.prefill_params.size();
}

}  // namespace

void ConversationCache::erase_locked(std::unordered_map<std::string, Slot>::iterator it) {
  bytes_ -= it->second.bytes;
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

void ConversationCache::put(std::string_view conversation_id, Entry entry, Clock::time_point now,
                            const Limits& limits) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t bytes = charge(conversation_id, entry);
  if (auto it = slots_.find(std::string(conversation_id)); it != slots_.end()) erase_locked(it);
  if (bytes > limits.max_bytes) {
    stats_.evicted++;
    return;
  }
  order_.emplace_back(conversation_id);
  Slot slot{std::move(entry), now, std::prev(order_.end()), bytes};
  slots_.emplace(std::string(conversation_id), std::move(slot));
  bytes_ += bytes;
  stats_.stored++;
  evict_locked(now, limits);
}

std::optional<ConversationCache::Entry> ConversationCache::take(std::string_view conversation_id,
                                                                Clock::time_point now,
                                                                std::chrono::milliseconds ttl) {
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
  Entry out = std::move(it->second.entry);
  erase_locked(it);
  stats_.taken++;
  return out;
}

ConversationCache::Stats ConversationCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.entries = slots_.size();
  s.bytes = bytes_;
  return s;
}

}  // namespace pdr::router::proxy
