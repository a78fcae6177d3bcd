// AdminThrottle: limits failed admin authentications, so the admin key cannot be guessed at
// network speed (one connection tried about 3,570 keys a second before there was a throttle).
//
// Failures are counted in token buckets at three scopes, each with its own burst and refill:
//   kAddress  the source address (IP, without the port)          kAddressLimits
//   kNetwork  its network: the IPv4 /24, the IPv6 /64             kNetworkLimits
//   kAll      every source together                               kAllLimits
// A failed authentication takes a token from each of its three buckets. While any of them is
// empty, a request with a wrong key is refused with 429 and not counted again. Many addresses
// (an IPv6 /64 holds 2^64, a loopback or a NAT many) therefore cannot multiply the guessing
// rate: the network and the global buckets bound it.
//
// A right key is always let in, throttled or not (AdminRoutes checks it first, in constant time,
// proto/base/secure_compare.h): behind a proxy or NAT every client shares one address, and a
// throttle that refused the right key would let anyone who can send a few wrong keys lock the
// operator out. The cost is that a throttled source still learns whether a guess was right;
// what makes guessing hopeless is the key's length (a random key of 128 bits or more: pdrouter
// warns at start about an admin key shorter than 16 characters), what the throttle adds is
// that failures are slowed to the refill rates, answered 429 and counted.
//
// The address and network tables are bounded (kMaxEntries each, least recently failing evicted
// first); an evicted entry starts again with a full bucket, and the global bucket still binds.
//
// Thread-safe (one mutex; only admin paths take it).
#pragma once

#include <chrono>
#include <cstddef>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

namespace pdr::router::clients {

class AdminThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  struct Limits {
    double burst;              // failures allowed back to back
    double refill_per_second;  // sustained failures per second
  };
  static constexpr Limits kAddressLimits{10, 2};
  static constexpr Limits kNetworkLimits{20, 4};
  static constexpr Limits kAllLimits{60, 10};
  static constexpr size_t kMaxEntries = 4096;

  enum class Scope { kNone, kAddress, kNetwork, kAll };

  // The narrowest scope whose bucket `address` has no failure token left in (kNone: not
  // throttled). A wrong key is then answered 429 without being counted again.
  Scope throttled(std::string_view address, Clock::time_point now);
  // Records one failed authentication from `address` in its three buckets.
  void failed(std::string_view address, Clock::time_point now);

  size_t tracked() const;           // addresses in the table (tests)
  size_t tracked_networks() const;  // networks in the table (tests)

  // "127.0.0.1:53412" -> "127.0.0.1", "[::1]:53412" -> "::1"; anything else as is.
  static std::string_view address_of(std::string_view peer);
  // "10.1.2.3" -> "10.1.2.0/24", "2001:db8:1:2:3::4" -> "2001:db8:1:2::/64", an IPv4-mapped IPv6
  // address as its IPv4 address; anything unparsable as is.
  static std::string network_of(std::string_view address);
  // "this address", "this address's network (/24 or /64)", "all addresses" (429 messages).
  static std::string_view describe(Scope scope);

 private:
  struct Bucket {
    double tokens = 0;
    Clock::time_point updated;
    std::list<std::string>::iterator lru;  // position in its table's lru (tables only)
  };
  // One scope's buckets by key, bounded, least recently failing evicted first.
  struct Table {
    Limits limits;
    std::unordered_map<std::string, Bucket> buckets;
    std::list<std::string> lru;  // front: most recently failed
    bool empty_for(const std::string& key, Clock::time_point now);
    void take(std::string key, Clock::time_point now);
  };
  static void refill(Bucket& b, const Limits& limits, Clock::time_point now);

  mutable std::mutex mu_;
  Table addresses_{kAddressLimits, {}, {}};
  Table networks_{kNetworkLimits, {}, {}};
  Bucket all_{kAllLimits.burst, Clock::time_point{}, {}};
};

}  // namespace pdr::router::clients
