// AdminThrottle: limits failed admin authentications per source address, so the admin key cannot
// be guessed at network speed (attacks-2026-11 bug 17: 3,570 guesses/s on one connection).
//
// Each source address (IP, without the port) has a token bucket of failures: kBurst tokens, one
// refilled every 1 / kRefillPerSecond s. A failed authentication takes a token. While the bucket
// is empty, every admin request from that address is refused with 429 before its key is looked
// at (a right key too: checking it would let the guessing go on), until a token is back.
// Successful authentications cost nothing.
//
// The table is bounded (kMaxAddresses, least recently failing address evicted first), so a peer
// with many addresses costs at most that much memory; an evicted address starts again with a
// full bucket, which only matters when more than kMaxAddresses addresses guess at once.
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

namespace pdr::router {

class AdminThrottle {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kBurst = 10;           // failures allowed back to back
  static constexpr double kRefillPerSecond = 2;  // sustained failures per second
  static constexpr size_t kMaxAddresses = 4096;

  // True when `address` has no failure token left: answer 429 without checking the key.
  bool throttled(std::string_view address, Clock::time_point now);
  // Records one failed authentication from `address`.
  void failed(std::string_view address, Clock::time_point now);

  size_t tracked() const;  // addresses in the table (tests)

  // "127.0.0.1:53412" -> "127.0.0.1", "[::1]:53412" -> "::1"; anything else as is.
  static std::string_view address_of(std::string_view peer);

 private:
  struct Bucket {
    double tokens = kBurst;
    Clock::time_point updated;
    std::list<std::string>::iterator lru;  // position in lru_
  };
  void refill(Bucket& b, Clock::time_point now) const;

  mutable std::mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_;
  std::list<std::string> lru_;  // front: most recently failed
};

}  // namespace pdr::router
