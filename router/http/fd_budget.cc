#include "router/http/fd_budget.h"

#include <algorithm>

namespace pdr::http {

FdBudget fit_fd_limit(uint64_t fd_limit, uint32_t max_connections, uint32_t max_concurrent_requests) {
  FdBudget b;
  const uint64_t conns = max_connections;
  const uint64_t in_flight = std::min<uint64_t>(max_concurrent_requests, conns);
  b.needed = conns + kUpstreamFdsPerRequest * in_flight + kFdHeadroom;
  b.max_connections = max_connections;
  if (fd_limit == 0 || b.needed <= fd_limit) return b;
  const uint64_t headroom = std::min<uint64_t>(kFdHeadroom, fd_limit / 4);
  const uint64_t budget = fd_limit > headroom ? fd_limit - headroom : 0;
  // Largest C with C + 2 * min(max_concurrent_requests, C) <= budget.
  uint64_t fit = 0;
  const uint64_t per_request = 1 + kUpstreamFdsPerRequest;
  if (budget >= per_request * max_concurrent_requests) {
    fit = budget - kUpstreamFdsPerRequest * max_concurrent_requests;
  } else {
    fit = budget / per_request;
  }
  fit = std::max<uint64_t>(1, std::min<uint64_t>(fit, conns));
  if (fit < conns) {
    b.max_connections = static_cast<uint32_t>(fit);
    b.clamped = true;
  }
  return b;
}

}  // namespace pdr::http
