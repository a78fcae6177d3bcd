// Failed admin authentications per source address; the contract is in admin_throttle.h.
#include "router/admin_throttle.h"

#include <algorithm>

namespace pdr::router {

std::string_view AdminThrottle::address_of(std::string_view peer) {
  if (peer.starts_with('[')) {
    const size_t close = peer.find(']');
    if (close != std::string_view::npos) return peer.substr(1, close - 1);
    return peer;
  }
  const size_t colon = peer.rfind(':');
  // One colon: IPv4 "a.b.c.d:port". More: an unbracketed IPv6 literal, kept whole.
  if (colon != std::string_view::npos && peer.find(':') == colon) return peer.substr(0, colon);
  return peer;
}

void AdminThrottle::refill(Bucket& b, Clock::time_point now) const {
  if (now <= b.updated) return;
  const double seconds = std::chrono::duration<double>(now - b.updated).count();
  b.tokens = std::min(kBurst, b.tokens + seconds * kRefillPerSecond);
  b.updated = now;
}

bool AdminThrottle::throttled(std::string_view address, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = buckets_.find(std::string(address));
  if (it == buckets_.end()) return false;
  refill(it->second, now);
  if (it->second.tokens >= kBurst) {  // back to full: forget the address
    lru_.erase(it->second.lru);
    buckets_.erase(it);
    return false;
  }
  return it->second.tokens < 1;
}

void AdminThrottle::failed(std::string_view address, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string key(address);
  auto it = buckets_.find(key);
  if (it == buckets_.end()) {
    if (buckets_.size() >= kMaxAddresses) {
      buckets_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(key);
    it = buckets_.emplace(std::move(key), Bucket{kBurst, now, lru_.begin()}).first;
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    refill(it->second, now);
  }
  it->second.tokens = std::max(0.0, it->second.tokens - 1);
}

size_t AdminThrottle::tracked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return buckets_.size();
}

}  // namespace pdr::router
