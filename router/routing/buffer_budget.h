// The buffered-bytes budget (limits.max_buffered_bytes), shared by every HTTP worker, and its
// /metrics section: the bytes held now, and the decode answers failed because buffering them
// would have gone over it. What takes from it: the HTTP server's charge for a request body being
// read (ProxyService::reserve), an admitted request's body and its legs' copies (router/proxy/admission.h),
// a buffered decode answer (ProxySession) and a node's /tokenize answer (cache_tokenize.h); each
// gives back exactly what it took. A member of ProxyCounters (router/proxy/proxy_counters.h); relaxed atomics.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::routing {

struct BufferBudget {
  std::atomic<int64_t> held{0};                    // gauge: bytes taken and not given back
  std::atomic<uint64_t> answers_over_budget{0};    // decode answers failed: buffering them would exceed it

  // Takes `bytes` from the budget (`limit` = limits.max_buffered_bytes; 0 = none). False (and
  // nothing taken) if that would go over it. Give them back with release().
  bool reserve(size_t bytes, uint64_t limit) {
    const auto n = static_cast<int64_t>(bytes);
    const int64_t before = held.fetch_add(n, std::memory_order_relaxed);
    if (limit != 0 && static_cast<uint64_t>(before + n) > limit) {
      held.fetch_sub(n, std::memory_order_relaxed);
      return false;
    }
    return true;
  }
  void release(int64_t bytes) { held.fetch_sub(bytes, std::memory_order_relaxed); }
};

// pdrouter_buffered_bytes and pdrouter_buffered_answers_over_budget_total.
void write_buffer_budget_metrics(MetricsWriter& out, const BufferBudget& budget);

}  // namespace pdr::router::routing
