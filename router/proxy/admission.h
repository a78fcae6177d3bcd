// Admission shared by every client request that makes pdrouter do upstream work: the P/D paths
// (ProxyService::admit) and the one-node endpoints (one_node_relay.h). Both refuse the same way:
//   503 shutting_down      pdrouter drains (begin_shutdown)
//   429 too_many_requests  limits.max_concurrent_requests requests already in flight (P/D and
//                          one-node together; orphaned prefill legs never count: orphan_legs.h),
//                          with Retry-After: 1
//   503 memory_budget      what the request's body costs would take limits.max_buffered_bytes
//                          over, with Retry-After: 1
// Each refusal is counted in pdrouter_requests_refused_total{reason}, and answered in the error
// shape of the request's path (client_api.h). What a request holds once
// admitted (one in-flight slot and its body's cost in the budget) is an AdmissionSlot.
//
// What a body costs is what pdrouter really holds for it, not its length: its buffer's capacity
// (charged by the HTTP server as it buffered it, router/http/body_budget.h, and taken over here) plus
// one copy per upstream leg, since the upstream client renders each leg into a wire buffer of
// its own and keeps it until the node's answer begins (a P/D request: 2, whether the dialect's
// legs overlap or not and for a decode served alone too; a one-node request: 1).
//
// Worker thread (the counters are atomics shared by every worker).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "router/http/response_writer.h"
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
  size_t bytes() const { return static_cast<size_t>(bytes_); }  // of the buffered-bytes budget
  // Gives the slot and the bytes back; later calls do nothing.
  void release();
  // The caller takes over both counts and gives them back itself (ProxySession, whose budget
  // also grows with a buffered answer); this object then holds nothing.
  void hand_over() { counters_ = nullptr; }

 private:
  ProxyCounters* counters_ = nullptr;
  int64_t bytes_ = 0;
};

// What a refusal below answered: its status and body bytes (for the access log).
struct Answered {
  int status = 0;
  uint64_t bytes = 0;
};

// While pdrouter drains: answers 503 shutting_down, counts it and returns true.
bool refuse_while_shutting_down(ProxyShared& shared, http::ResponseWriter& writer, std::string_view path = {},
                                Answered* answered = nullptr);

// Takes an in-flight slot and the body's cost (see above; `leg_copies` copies of it for the legs)
// of the buffered-bytes budget under `worker`'s current limits, taking over the server's charge
// of `request`'s body. Over either: answers 429 too_many_requests / 503 memory_budget (both with
// Retry-After: 1), counts the refusal, takes nothing (the body's charge stays with the request,
// which gives it back) and returns no slot; `answered` (optional) then gets the answer's status
// and body bytes (for the access log).
std::optional<AdmissionSlot> take_admission_slot(WorkerContext& worker, http::Request& request, size_t leg_copies,
                                                 http::ResponseWriter& writer, Answered* answered = nullptr);

}  // namespace pdr::router::proxy
