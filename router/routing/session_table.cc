#include "router/routing/session_table.h"

#include "proto/base/keyed_hash.h"
#include "router/policies/policy.h"

namespace pdr::router::routing {

size_t SessionTable::SlotHash::operator()(std::string_view slot) const {
  return static_cast<size_t>(affinity_hash(slot, process_hash_key().k0));
}

std::string SessionTable::slot_key(const Key& key) {
  std::string out;
  slot_key_into(key, &out);
  return out;
}

void SessionTable::slot_key_into(const Key& key, std::string* out) {
  out->clear();
  out->reserve(1 + key.binding.size() + key.id.size());
  *out += static_cast<char>(key.binding.size() & 0xff);
  *out += key.binding;
  *out += key.id;
}

SessionTable::Shard& SessionTable::shard_of(std::string_view slot) {
  // Another seed than the buckets' hash, so a shard's members do not share their bucket bits.
  return shards_[affinity_hash(slot, process_hash_key().k1) % kShards];
}

std::optional<SessionTable::Binding> SessionTable::find(const Key& key, Clock::time_point now, const Limits& limits) {
  thread_local std::string slot;  // a lookup allocates nothing once it has grown
  slot_key_into(key, &slot);
  Shard& sh = shard_of(slot);
  std::lock_guard lock(sh.mutex);
  auto it = sh.by_slot.find(slot);
  if (it == sh.by_slot.end()) return std::nullopt;
  const auto entry = it->second;
  if (now - entry->used_at > limits.idle_ttl) {
    sh.by_slot.erase(it);
    sh.order.erase(entry);
    entries_.fetch_sub(1, std::memory_order_relaxed);
    expired_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  entry->used_at = now;
  sh.order.splice(sh.order.begin(), sh.order, entry);
  return entry->binding;
}

void SessionTable::store(const Key& key, std::string_view prefill_key, std::string_view decode_key,
                         Clock::time_point now, const Limits& limits) {
  std::string slot = slot_key(key);
  Shard& sh = shard_of(slot);
  // Each shard holds its share of max_sessions (rounded up): the total stays within a shard
  // count of the limit, and no shard outgrows its share whatever ids arrive.
  const size_t cap = std::max<size_t>(1, (limits.max_sessions + kShards - 1) / kShards);
  std::lock_guard lock(sh.mutex);
  if (auto it = sh.by_slot.find(slot); it != sh.by_slot.end()) {
    const auto entry = it->second;
    if (entry->binding.prefill_key != prefill_key) entry->binding.prefill_key.assign(prefill_key);
    if (entry->binding.decode_key != decode_key) entry->binding.decode_key.assign(decode_key);
    entry->used_at = now;
    entry->shared_at = now;
    sh.order.splice(sh.order.begin(), sh.order, entry);
  } else {
    sh.order.push_front(Entry{std::move(slot), Binding{std::string(prefill_key), std::string(decode_key)}, now, now});
    sh.by_slot.emplace(sh.order.front().slot, sh.order.begin());
    entries_.fetch_add(1, std::memory_order_relaxed);
  }
  while (!sh.order.empty()) {
    Entry& oldest = sh.order.back();
    const bool over = sh.order.size() > cap;
    const bool stale = now - oldest.used_at > limits.idle_ttl;
    if (!over && !stale) break;
    (over ? evicted_ : expired_).fetch_add(1, std::memory_order_relaxed);
    sh.by_slot.erase(oldest.slot);
    sh.order.pop_back();
    entries_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void SessionTable::bind(const Key& key, std::string_view prefill_key, std::string_view decode_key,
                        Clock::time_point now, const Limits& limits) {
  store(key, prefill_key, decode_key, now, limits);
  if (Replication* r = replication_.load(std::memory_order_acquire)) {
    r->bound(key, Binding{std::string(prefill_key), std::string(decode_key)}, limits.idle_ttl);
  }
}

void SessionTable::mirror(const Key& key, std::string_view prefill_key, std::string_view decode_key,
                          Clock::time_point now, const Limits& limits) {
  store(key, prefill_key, decode_key, now, limits);
  mirrored_.fetch_add(1, std::memory_order_relaxed);
}

void SessionTable::refresh(const Key& key, Clock::time_point now, const Limits& limits) {
  Replication* r = replication_.load(std::memory_order_acquire);
  if (r == nullptr) return;
  thread_local std::string slot;
  slot_key_into(key, &slot);
  Shard& sh = shard_of(slot);
  Binding binding;
  {
    std::lock_guard lock(sh.mutex);
    auto it = sh.by_slot.find(slot);
    if (it == sh.by_slot.end() || now - it->second->shared_at <= limits.idle_ttl / 2) return;
    it->second->shared_at = now;
    binding = it->second->binding;
  }
  r->bound(key, binding, limits.idle_ttl);
}

SessionTable::Stats SessionTable::stats() const {
  Stats s;
  s.entries = entries_.load(std::memory_order_relaxed);
  s.evicted = evicted_.load(std::memory_order_relaxed);
  s.expired = expired_.load(std::memory_order_relaxed);
  s.mirrored = mirrored_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace pdr::router::routing
