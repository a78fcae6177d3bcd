// Admission shared by every client request that makes pdrouter do upstream work: the P/D paths
// (ProxyService::admit) and the one-node endpoints (one_node_relay.h). Both refuse the same way:
//   503 shutting_down      pdrouter drains (begin_shutdown), also to requests waiting in the queue
//   429 too_many_requests  limits.max_concurrent_requests requests already in flight (P/D and
//                          one-node together; orphaned prefill legs never count: orphan_legs.h)
//                          and the admission queue is off (limits.max_queued_requests,
//                          max_queued_bytes or queue_timeout_ms 0), with Retry-After: 1
//   429 queue_full         all slots in flight and the admission queue (admission_queue.h) holds
//                          limits.max_queued_requests requests or its bodies would pass
//                          limits.max_queued_bytes (the message names which), Retry-After: 1
//   503 queue_timeout      waited limits.queue_timeout_ms in the queue, Retry-After: 1
//   503 memory_budget      what the request's body costs would take limits.max_buffered_bytes
//                          over, with Retry-After: 1 (checked once a slot is the request's: a
//                          waiting body holds only the buffer the server charged as it read it)
// Each refusal is counted in pdrouter_requests_refused_total{reason}, and answered in the error
// shape of the request's path (client_api.h). What a request holds once
// admitted (one in-flight slot and its body's cost in the budget) is an AdmissionSlot.
//
// Waiting: with every slot in flight a request joins the admission queue (its class and tenant
// from its QueuePlace) and its worker goes on serving others. It leaves when a slot is handed to
// it (a post to its worker), when its deadline passes, when its client goes away (no leg is
// ever sent; counted in pdrouter_admission_queue_client_gone_total), or at the drain.
//
// What a body costs is what pdrouter really holds for it, not its length: its buffer's capacity
// (charged by the HTTP server as it buffered it, router/http/body_budget.h, and taken over here) plus
// one copy per upstream leg, since the upstream client renders each leg into a wire buffer of
// its own and keeps it until the node's answer begins (a P/D request: 2, whether the dialect's
// legs overlap or not and for a decode served alone too; a one-node request: 1).
//
// Worker thread (the counters are atomics shared by every worker).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "router/http/response_writer.h"
#include "router/proxy/admission_queue.h"
#include "router/proxy/proxy_shared.h"

namespace pdr::router::proxy {

// One admitted request's share of limits.max_concurrent_requests (pdrouter_requests_in_flight)
// and of limits.max_buffered_bytes (its body's bytes). Given back exactly once: by release(), by
// the destructor, or never by this object after hand_over(). Movable, not copyable.
class AdmissionSlot {
 public:
  AdmissionSlot() = default;
  // `queue`: where the slot goes back (the head waiter gets it); null: straight to
  // counters.in_flight (tests without a queue).
  AdmissionSlot(ProxyCounters& counters, size_t body_bytes, AdmissionQueue* queue = nullptr)
      : counters_(&counters), queue_(queue), bytes_(static_cast<int64_t>(body_bytes)) {}
  AdmissionSlot(AdmissionSlot&& other) noexcept
      : counters_(other.counters_), queue_(other.queue_), bytes_(other.bytes_) {
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
  AdmissionQueue* queue_ = nullptr;
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

// Gives one in-flight slot back to the queue (the head waiter gets it): for what holds a slot
// without an AdmissionSlot (ProxySession, after AdmissionSlot::hand_over).
void give_back_slot(ProxyShared& shared);

// Where a request waits: its priority class and its tenant's FIFO (admission_queue.h).
struct QueuePlace {
  uint32_t priority = kDefaultPriority;
  std::string tenant;
};

// How long an admitted request waited in the queue (both zero: it did not wait).
struct QueueWait {
  std::chrono::steady_clock::time_point start{}, end{};
  bool waited() const { return start != std::chrono::steady_clock::time_point{}; }
};

// What admit_or_queue() does once it decided, on the request's worker: admitted() with the
// slot, or refused() after the answer was sent (`answered`: its status and body bytes for the
// access log; status 0: the client went away while the request waited, nothing was sent).
class AdmissionContinuation {
 public:
  virtual ~AdmissionContinuation() = default;
  virtual void admitted(http::Request& request, http::ResponseWriter writer, AdmissionSlot slot,
                        const QueueWait& wait) = 0;
  virtual void refused(http::Request& request, const Answered& answered) = 0;
};

// Takes an in-flight slot and the body's cost (see above; `leg_copies` copies of it for the legs)
// of the buffered-bytes budget under `worker`'s current limits, taking over the server's charge
// of `request`'s body, then runs `then.admitted(request, writer, slot, wait)`; with every slot
// in flight the request waits in the admission queue at `place` first (its request and writer
// moved into the queue's entry, `then` with them). Refused (see above): answered, counted,
// nothing taken (the body's charge stays with the request, which gives it back), then
// `then.refused(request, answered)`. `then` is any movable object with those two members; it is
// allocated only when the request must wait. Call after refuse_while_shutting_down().
template <class Then>
void admit_or_queue(WorkerContext& worker, http::Request& request, http::ResponseWriter& writer, size_t leg_copies,
                    QueuePlace place, Then then);

// ---- implementation -------------------------------------------------------------------------

namespace admission_detail {

enum class Verdict : uint8_t { kAdmitted, kRefused, kWait };
// A slot now (kAdmitted, *slot set), a refusal answered (kRefused, *answered set) or kWait.
Verdict take_now(WorkerContext& worker, http::Request& request, size_t leg_copies, http::ResponseWriter& writer,
                 Answered* answered, std::optional<AdmissionSlot>* slot);
void wait_for_slot(WorkerContext& worker, http::Request&& request, http::ResponseWriter&& writer, size_t leg_copies,
                   QueuePlace place, std::unique_ptr<AdmissionContinuation> then);

template <class Then>
class Continuation final : public AdmissionContinuation {
 public:
  explicit Continuation(Then then) : then_(std::move(then)) {}
  void admitted(http::Request& request, http::ResponseWriter writer, AdmissionSlot slot,
                const QueueWait& wait) override {
    then_.admitted(request, std::move(writer), std::move(slot), wait);
  }
  void refused(http::Request& request, const Answered& answered) override { then_.refused(request, answered); }

 private:
  Then then_;
};

}  // namespace admission_detail

template <class Then>
void admit_or_queue(WorkerContext& worker, http::Request& request, http::ResponseWriter& writer, size_t leg_copies,
                    QueuePlace place, Then then) {
  Answered answered;
  std::optional<AdmissionSlot> slot;
  switch (admission_detail::take_now(worker, request, leg_copies, writer, &answered, &slot)) {
    case admission_detail::Verdict::kAdmitted:
      then.admitted(request, std::move(writer), *std::move(slot), QueueWait{});
      return;
    case admission_detail::Verdict::kRefused:
      then.refused(request, answered);
      return;
    case admission_detail::Verdict::kWait:
      break;
  }
  admission_detail::wait_for_slot(worker, std::move(request), std::move(writer), leg_copies, std::move(place),
                                  std::make_unique<admission_detail::Continuation<Then>>(std::move(then)));
}

}  // namespace pdr::router::proxy
