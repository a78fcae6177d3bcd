// TokenBucket: up to `capacity` tokens, refilled continuously at `rate` tokens a second. A request
// for n tokens takes all n or none (try_take), and says how long until n will be there; charge()
// takes tokens regardless and may leave the bucket below zero (a debt later refills pay first:
// how a request that turned out bigger than its reservation is billed). put_back() returns
// tokens, never above capacity. Pure: the caller passes the time and serialises access.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace pdr::router::clients {

class TokenBucket {
 public:
  using Clock = std::chrono::steady_clock;

  TokenBucket() = default;
  // Starts full.
  TokenBucket(double capacity, double rate, Clock::time_point now)
      : capacity_(capacity), rate_(rate), tokens_(capacity), updated_(now) {}

  double capacity() const { return capacity_; }
  double rate() const { return rate_; }

  // New limits; the tokens held carry over (at most the new capacity).
  void reconfigure(double capacity, double rate, Clock::time_point now) {
    refill(now);
    capacity_ = capacity;
    rate_ = rate;
    tokens_ = std::min(tokens_, capacity_);
  }

  // Takes `n` tokens and returns true, or takes none and returns false with *wait_seconds the time
  // until `n` will be there (infinity when n > capacity: never).
  bool try_take(double n, Clock::time_point now, double* wait_seconds) {
    refill(now);
    if (tokens_ >= n) {
      tokens_ -= n;
      return true;
    }
    if (wait_seconds != nullptr) {
      *wait_seconds = n > capacity_ || rate_ <= 0 ? std::numeric_limits<double>::infinity() : (n - tokens_) / rate_;
    }
    return false;
  }

  void charge(double n, Clock::time_point now) {
    refill(now);
    tokens_ -= n;
  }

  void put_back(double n, Clock::time_point now) {
    refill(now);
    tokens_ = std::min(capacity_, tokens_ + n);
  }

  double tokens(Clock::time_point now) {
    refill(now);
    return tokens_;
  }

  // Whole seconds to announce in Retry-After for a wait: at least 1, rounded up.
  static long retry_after_seconds(double wait_seconds) {
    if (!std::isfinite(wait_seconds)) return 0;
    return std::max(1L, static_cast<long>(std::ceil(wait_seconds)));
  }

 private:
  void refill(Clock::time_point now) {
    if (now > updated_) {
      const double seconds = std::chrono::duration<double>(now - updated_).count();
      tokens_ = std::min(capacity_, tokens_ + seconds * rate_);
      updated_ = now;
    }
  }

  double capacity_ = 0;
  double rate_ = 0;
  double tokens_ = 0;
  Clock::time_point updated_{};
};

}  // namespace pdr::router::clients
