// KvEventsRateLimit: one node's allowance of KV event batches and bytes, as two token buckets
// that each hold one second of their rate (the window) and refill continuously. The KV events
// subscriber (kv_events_subscriber.h) charges every message a node sends, live or replayed,
// before decoding it; a message the allowance cannot pay for is discarded, so a node that
// publishes faster than its allowance costs the router a recv() per message, never a decode, an
// index update or a queue that grows.
//
// A bucket starts full: a node's first second may use its whole allowance at once.
// Pure (the caller passes the time); one thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace pdr::router::cache {

class KvEventsRateLimit {
 public:
  using Clock = std::chrono::steady_clock;

  // Rates of 0 are taken as 1 (nothing would ever pass otherwise).
  KvEventsRateLimit(uint32_t batches_per_sec, uint64_t bytes_per_sec, Clock::time_point now);

  // True, and one batch of `bytes` paid for, when both buckets hold enough; false leaves both as
  // they were (a refused batch costs nothing, so the allowance refills while a flood goes on).
  bool admit(uint64_t bytes, Clock::time_point now);

 private:
  void refill(Clock::time_point now);

  double batch_rate_, byte_rate_;  // per second; also each bucket's capacity
  double batches_, bytes_;         // what the buckets hold now
  Clock::time_point last_;
};

}  // namespace pdr::router::cache
