// Admission shared by every client request that makes pdrouter do upstream work: the P/D paths
// (ProxyService::admit) and the one-node endpoints (one_node_relay.h). Both refuse the same way:
//   503 shutting_down      pdrouter drains (begin_shutdown)
//   429 too_many_requests  limits.max_concurrent_requests requests already in flight (P/D and
//                          one-node together; orphaned prefill legs never count: orphan_legs.h),
//                          with Retry-After: 1
//   503 memory_budget      the request body would take limits.max_buffered_bytes over its budget,
//                          with Retry-After: 1
// Each refusal is counted in pdrouter_requests_refused_total{reason}. What a request holds once
// admitted (one in-flight slot and its body's bytes of the budget) is an AdmissionSlot.
//
// Worker thread (the counters are atomics shared by every worker).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "http/response_writer.h"
#include "router/proxy/proxy_shared.h"

namespace pdr::router::proxy {

// One admitted request's share of limits.max_concurrent_requests (pdrouter_requests_in_flight)
// and of limits.max_buffered_bytes (its body's bytes). Given back exactly once: by release(), by
// the destructor, or never by this object after hand_over(). Movable, not copyable.
class AdmissionSlot {
 public:
  AdmissionSlot() = default;
  AdmissionSlot(ProxyCounters& counters, size_t body_bytes)
      : counters_(&counters), bytes_(static_cast<int64_t>(body_bytes)) {}
  AdmissionSlot(AdmissionSlot&& other) noexcept : counters_(other.counters_), bytes_(other.bytes_) {
    other.counters_ = nullptr;
  }
  AdmissionSlot& operator=(AdmissionSlot&& other) noexcept;
  AdmissionSlot(const AdmissionSlot&) = delete;
  AdmissionSlot& operator=(const AdmissionSlot&) = delete;
  ~AdmissionSlot() { release(); }

  bool held() const { return counters_ != nullptr; }
  // Gives the slot and the bytes back; later calls do nothing.
  void release();
  // The caller takes over both counts and gives them back itself (ProxySession, whose budget
  // also grows with a buffered answer); this object then holds nothing.
  void hand_over() { counters_ = nullptr; }

 private:
  ProxyCounters* counters_ = nullptr;
  int64_t bytes_ = 0;
};

// While pdrouter drains: answers 503 shutting_down, counts it and returns true.
bool refuse_while_shutting_down(ProxyShared& shared, http::ResponseWriter& writer);

// Takes an in-flight slot and `body_bytes` of the buffered-bytes budget under `worker`'s current
// limits. Over either: answers 429 too_many_requests / 503 memory_budget (both with
// Retry-After: 1), counts the refusal, takes nothing and returns no slot.
std::optional<AdmissionSlot> take_admission_slot(WorkerContext& worker, size_t body_bytes,
                                                 http::ResponseWriter& writer);

}  // namespace pdr::router::proxy
