#include "router/cache/kv_events_rate_limit.h"

#include <algorithm>

namespace pdr::router::cache {

KvEventsRateLimit::KvEventsRateLimit(uint32_t batches_per_sec, uint64_t bytes_per_sec,
                                     Clock::time_point now)
    : batch_rate_(static_cast<double>(std::max<uint32_t>(1, batches_per_sec))),
      byte_rate_(static_cast<double>(std::max<uint64_t>(1, bytes_per_sec))),
      batches_(batch_rate_),
      bytes_(byte_rate_),
      last_(now) {}

void KvEventsRateLimit::refill(Clock::time_point now) {
  if (now <= last_) return;  // steady_clock never goes back; equal times add nothing
  const double seconds = std::chrono::duration<double>(now - last_).count();
  last_ = now;
  batches_ = std::min(batch_rate_, batches_ + seconds * batch_rate_);
  bytes_ = std::min(byte_rate_, bytes_ + seconds * byte_rate_);
}

bool KvEventsRateLimit::admit(uint64_t bytes, Clock::time_point now) {
  refill(now);
  const double cost = static_cast<double>(bytes);
  if (batches_ < 1.0 || bytes_ < cost) return false;
  batches_ -= 1.0;
  bytes_ -= cost;
  return true;
}

}  // namespace pdr::router::cache
