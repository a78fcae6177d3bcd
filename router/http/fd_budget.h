// How many client connections fit in the process's open-file limit (so connections are refused at accept, not legs failed later).
//
// Each client connection holds one descriptor, and each request in flight up to two more for its
// upstream legs (prefill and decode, both open at once in the concurrent dialects); pdrouter's
// own descriptors (loops, discovery, logs, pooled idle upstream connections, each worker's
// reserve descriptor for answering 503 when accept() finds none: http_worker.h) need headroom
// too. Requests in flight never exceed the connections, so clamping max_connections alone keeps
// everything within the limit; a connection beyond it is answered 503 at accept.
#pragma once

#include <cstdint>

namespace pdr::http {

struct FdBudget {
  uint64_t needed = 0;            // descriptors the configured limits may use, headroom included
  uint32_t max_connections = 0;   // effective value: the configured one, or less when it cannot fit
  bool clamped = false;
};

// `fd_limit`: RLIMIT_NOFILE's soft limit (0 or RLIM_INFINITY-sized values: nothing is clamped).
FdBudget fit_fd_limit(uint64_t fd_limit, uint32_t max_connections, uint32_t max_concurrent_requests);

// Descriptors kept aside for everything but client connections and their legs: at most this,
// and at most a quarter of the limit.
inline constexpr uint64_t kFdHeadroom = 256;
inline constexpr uint64_t kUpstreamFdsPerRequest = 2;

}  // namespace pdr::http
