// Failed admin authentications per address, per network and in all; the contract is in
// admin_throttle.h.
#include "router/admin_throttle.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>

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

std::string AdminThrottle::network_of(std::string_view address) {
  const std::string text(address);
  unsigned char bytes[16];
  if (inet_pton(AF_INET, text.c_str(), bytes) == 1) {
    char out[32];
    std::snprintf(out, sizeof out, "%u.%u.%u.0/24", bytes[0], bytes[1], bytes[2]);
    return out;
  }
  if (inet_pton(AF_INET6, text.c_str(), bytes) == 1) {
    static constexpr unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::equal(kMapped, kMapped + 12, bytes)) {
      char out[32];
      std::snprintf(out, sizeof out, "%u.%u.%u.0/24", bytes[12], bytes[13], bytes[14]);
      return out;
    }
    char out[64];
    std::snprintf(out, sizeof out, "%x:%x:%x:%x::/64", (bytes[0] << 8) | bytes[1], (bytes[2] << 8) | bytes[3],
                  (bytes[4] << 8) | bytes[5], (bytes[6] << 8) | bytes[7]);
    return out;
  }
  return text;
}

std::string_view AdminThrottle::describe(Scope scope) {
  switch (scope) {
    case Scope::kNone: return "nobody";
    case Scope::kAddress: return "this address";
    case Scope::kNetwork: return "this address's network (/24 or /64)";
    case Scope::kAll: return "all addresses together";
  }
  return "?";
}

void AdminThrottle::refill(Bucket& b, const Limits& limits, Clock::time_point now) {
  if (now <= b.updated) return;
  const double seconds = std::chrono::duration<double>(now - b.updated).count();
  b.tokens = std::min(limits.burst, b.tokens + seconds * limits.refill_per_second);
  b.updated = now;
}

bool AdminThrottle::Table::empty_for(const std::string& key, Clock::time_point now) {
  auto it = buckets.find(key);
  if (it == buckets.end()) return false;
  refill(it->second, limits, now);
  if (it->second.tokens >= limits.burst) {  // back to full: forget the key
    lru.erase(it->second.lru);
    buckets.erase(it);
    return false;
  }
  return it->second.tokens < 1;
}

void AdminThrottle::Table::take(std::string key, Clock::time_point now) {
  auto it = buckets.find(key);
  if (it == buckets.end()) {
    if (buckets.size() >= kMaxEntries) {
      buckets.erase(lru.back());
      lru.pop_back();
    }
    lru.push_front(key);
    it = buckets.emplace(std::move(key), Bucket{limits.burst, now, lru.begin()}).first;
  } else {
    lru.splice(lru.begin(), lru, it->second.lru);
    refill(it->second, limits, now);
  }
  it->second.tokens = std::max(0.0, it->second.tokens - 1);
}

AdminThrottle::Scope AdminThrottle::throttled(std::string_view address, Clock::time_point now) {
  const std::string network = network_of(address);
  std::lock_guard<std::mutex> lock(mu_);
  if (addresses_.empty_for(std::string(address), now)) return Scope::kAddress;
  if (networks_.empty_for(network, now)) return Scope::kNetwork;
  refill(all_, kAllLimits, now);
  if (all_.tokens < 1) return Scope::kAll;
  return Scope::kNone;
}

void AdminThrottle::failed(std::string_view address, Clock::time_point now) {
  std::string network = network_of(address);
  std::lock_guard<std::mutex> lock(mu_);
  addresses_.take(std::string(address), now);
  networks_.take(std::move(network), now);
  refill(all_, kAllLimits, now);
  all_.tokens = std::max(0.0, all_.tokens - 1);
}

size_t AdminThrottle::tracked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return addresses_.buckets.size();
}

size_t AdminThrottle::tracked_networks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return networks_.buckets.size();
}

}  // namespace pdr::router
