#include "router/proxy/admission.h"

#include <algorithm>
#include <string>

#include "router/proxy/client_api.h"
#include "router/routing/session_timer.h"

namespace pdr::router::proxy {

AdmissionSlot& AdmissionSlot::operator=(AdmissionSlot&& other) noexcept {
  if (this != &other) {
    release();
    counters_ = other.counters_;
    queue_ = other.queue_;
    bytes_ = other.bytes_;
    other.counters_ = nullptr;
  }
  return *this;
}

void AdmissionSlot::release() {
  if (counters_ == nullptr) return;
  if (bytes_ != 0) counters_->buffered.release(bytes_);
  if (queue_ != nullptr) {
    queue_->release();
  } else {
    counters_->in_flight.fetch_sub(1, std::memory_order_relaxed);
  }
  counters_ = nullptr;
}

void give_back_slot(ProxyShared& shared) { shared.admission_queue.release(); }

namespace {

void answer_shutting_down(ProxyShared& shared, http::ResponseWriter& writer, std::string_view path,
                          Answered* answered) {
  shared.counters.refuse(Refusal::kShuttingDown);
  http::Response r = api_error_response(path, 503, "pdrouter is shutting down", "server_error", "shutting_down");
  if (answered != nullptr) *answered = {r.status, r.body.size()};
  writer.send(std::move(r));
}

// Refusals that ask the client to come back in a second.
void answer_retry(ProxyCounters& counters, Refusal why, std::string_view path, int status, const std::string& message,
                  const char* type, const char* code, http::ResponseWriter& writer, Answered* answered) {
  counters.refuse(why);
  http::Response r = api_error_response(path, status, message, type, code);
  r.headers.push_back({"Retry-After", "1"});
  *answered = {r.status, r.body.size()};
  writer.send(std::move(r));
}

// The request holds a slot: its body's cost joins the buffered-bytes budget (or the slot goes
// back and the client gets 503 memory_budget).
std::optional<AdmissionSlot> charge_body(WorkerContext& worker, http::Request& request, size_t leg_copies,
                                         http::ResponseWriter& writer, Answered* answered) {
  ProxyCounters& counters = worker.counters();
  // The body stays in memory while the request is served (a P/D request renders retries from it;
  // a one-node request holds it until the node has it), and each leg's wire copy while it is
  // written: all of it takes its share of limits.max_buffered_bytes, shared by every worker.
  // The server charged the body's buffer already (a server without a budget, in tests: charged
  // here).
  const uint32_t budget = worker.topology()->limits.max_buffered_bytes;
  const size_t charged = request.body_charge.bytes();
  const size_t buffer = charged != 0 || request.body.empty() ? 0 : request.body.capacity();
  const size_t extra = buffer + leg_copies * request.body.size();
  if (!counters.buffered.reserve(extra, budget)) {
    give_back_slot(worker.shared());
    answer_retry(counters, Refusal::kMemoryBudget, request.path, 503,
                 "pdrouter is holding too many request bytes (limits.max_buffered_bytes = " + std::to_string(budget) +
                     ")",
                 "server_error", "memory_budget", writer, answered);
    return std::nullopt;
  }
  request.body_charge.take();  // its bytes are the slot's now
  return AdmissionSlot(counters, charged + extra, &worker.shared().admission_queue);
}

// A request waiting for a slot, on its worker (WorkerContext's thread only, but for what the
// queue does with its Waiter part). Kept alive by the queue while it waits and by the post that
// tells it; the client-close callback and the deadline hold it weakly.
class QueuedRequest final : public AdmissionQueue::Waiter, public std::enable_shared_from_this<QueuedRequest> {
 public:
  QueuedRequest(WorkerContext& worker, http::Request&& request, http::ResponseWriter&& writer, size_t leg_copies,
                QueuePlace&& place, uint64_t bytes, std::unique_ptr<AdmissionContinuation> then)
      : Waiter(place.priority, std::move(place.tenant), bytes, worker.index()),
        worker_(worker),
        request_(std::move(request)),
        writer_(std::move(writer)),
        leg_copies_(leg_copies),
        then_(std::move(then)),
        queued_at_(std::chrono::steady_clock::now()) {}

  // Queued: watches the client and the deadline.
  void start(std::chrono::milliseconds timeout) {
    timeout_ = timeout;
    std::weak_ptr<QueuedRequest> weak = shared_from_this();
    deadline_.start(worker_.timers(), timeout, [weak] {
      if (auto self = weak.lock()) self->on_deadline();
    });
    writer_.on_client_close([weak] {  // fires at once if the client is already gone
      if (auto self = weak.lock()) self->on_client_gone();
    });
  }

  // Granted without waiting (a slot came free before the enqueue finished), or told by the
  // queue's notify: granted or drained.
  void woken() override {
    if (done_) return;  // left already: its client went away (a grant was given back then)
    if (take_grant()) {
      // A slot handed over after the deadline (its worker's loop ran late, or the releasing
      // worker's hand-off came as the deadline passed, before the deadline's own callback)
      // is passed on: the request is answered as its deadline says, never admitted later.
      if (std::chrono::steady_clock::now() - queued_at_ > timeout_) {
        end();
        give_back_slot(worker_.shared());
        refuse_timed_out();
        return;
      }
      admitted();
    } else if (outcome() == AdmissionQueue::Outcome::kShutDown) {
      end();
      Answered answered;
      answer_shutting_down(worker_.shared(), writer_, request_.path, &answered);
      then_->refused(request_, answered);
    }
  }

  void admitted() {
    end();
    const auto now = std::chrono::steady_clock::now();
    worker_.counters().admission_queue.wait.record(now - queued_at_);
    Answered answered;
    std::optional<AdmissionSlot> slot = charge_body(worker_, request_, leg_copies_, writer_, &answered);
    if (!slot) {
      then_->refused(request_, answered);
      return;
    }
    then_->admitted(request_, std::move(writer_), *std::move(slot), QueueWait{queued_at_, now});
  }

  // Not queued: the queue is full or drains.
  void refuse_now(AdmissionQueue::Enqueued why, const config::Topology::Limits& limits) {
    end();
    Answered answered;
    if (why == AdmissionQueue::Enqueued::kShutDown) {
      answer_shutting_down(worker_.shared(), writer_, request_.path, &answered);
    } else {
      const bool bytes = why == AdmissionQueue::Enqueued::kFullBytes;
      answer_retry(worker_.counters(), Refusal::kQueueFull, request_.path, 429,
                   bytes ? "too many requests in flight, and the admission queue's waiting bodies would pass "
                           "limits.max_queued_bytes = " + std::to_string(limits.max_queued_bytes)
                         : "too many requests in flight, and the admission queue is full (limits.max_queued_requests = " +
                               std::to_string(limits.max_queued_requests) + ")",
                   "rate_limit_error", "too_many_requests", writer_, &answered);
    }
    then_->refused(request_, answered);
  }

 private:
  void end() {
    done_ = true;
    deadline_.stop();
  }

  void on_deadline() {
    if (done_ || worker_.shared().admission_queue.withdraw(*this) != AdmissionQueue::Outcome::kWaiting) {
      return;  // a grant or the drain won the race: their notify is on its way
    }
    end();
    refuse_timed_out();
  }

  void refuse_timed_out() {
    Answered answered;
    answer_retry(worker_.counters(), Refusal::kQueueTimeout, request_.path, 503,
                 "no request slot came free within limits.queue_timeout_ms = " +
                     std::to_string(worker_.topology()->limits.queue_timeout.count()) +
                     " (limits.max_concurrent_requests in flight)",
                 "server_error", "queue_timeout", writer_, &answered);
    then_->refused(request_, answered);
  }

  void on_client_gone() {
    if (done_) return;
    const AdmissionQueue::Outcome before = worker_.shared().admission_queue.withdraw(*this);
    if (before == AdmissionQueue::Outcome::kShutDown) return;  // the drain's notify answers (nobody hears)
    end();
    ProxyCounters::bump(worker_.counters().admission_queue.client_gone);
    // Granted meanwhile: the slot goes on to the next waiter at once, nothing was sent.
    if (before == AdmissionQueue::Outcome::kGranted && take_grant()) give_back_slot(worker_.shared());
    then_->refused(request_, Answered{});
  }

  WorkerContext& worker_;
  http::Request request_;
  http::ResponseWriter writer_;
  const size_t leg_copies_;
  std::unique_ptr<AdmissionContinuation> then_;
  const std::chrono::steady_clock::time_point queued_at_;
  std::chrono::milliseconds timeout_{0};  // limits.queue_timeout_ms when it was queued
  SessionTimer deadline_;
  bool done_ = false;
};

}  // namespace

bool refuse_while_shutting_down(ProxyShared& shared, http::ResponseWriter& writer, std::string_view path,
                                Answered* answered) {
  if (!shared.shutting_down.load(std::memory_order_relaxed)) return false;
  answer_shutting_down(shared, writer, path, answered);
  return true;
}

namespace admission_detail {

Verdict take_now(WorkerContext& worker, http::Request& request, size_t leg_copies, http::ResponseWriter& writer,
                 Answered* answered, std::optional<AdmissionSlot>* slot) {
  const auto& limits = worker.topology()->limits;
  AdmissionQueue& queue = worker.shared().admission_queue;
  const bool queue_on = limits.queue_enabled();
  // Orphaned prefill legs (orphan_legs.h) are not counted here: a prefill that never answers
  // would turn every request into an orphan holding a client's slot, and a handful of clients
  // would be refused most of the time. limits.max_orphan_legs_per_node bounds them instead.
  if (!(queue_on ? queue.try_take(limits.max_concurrent_requests)
                 : queue.take_without_queue(limits.max_concurrent_requests))) {
    if (queue_on) return Verdict::kWait;
    answer_retry(worker.counters(), Refusal::kTooBusy, request.path, 429,
                 "too many requests in flight (limits.max_concurrent_requests = " +
                     std::to_string(limits.max_concurrent_requests) + ")",
                 "rate_limit_error", "too_many_requests", writer, answered);
    return Verdict::kRefused;
  }
  *slot = charge_body(worker, request, leg_copies, writer, answered);
  return *slot ? Verdict::kAdmitted : Verdict::kRefused;
}

void wait_for_slot(WorkerContext& worker, http::Request&& request, http::ResponseWriter&& writer, size_t leg_copies,
                   QueuePlace place, std::unique_ptr<AdmissionContinuation> then) {
  const auto& limits = worker.topology()->limits;
  // What the waiting body holds: the buffer the server charged as it read it (its length
  // without a server budget, in tests).
  const uint64_t bytes = std::max<uint64_t>(request.body_charge.bytes(), request.body.size());
  auto waiting = std::make_shared<QueuedRequest>(worker, std::move(request), std::move(writer), leg_copies,
                                                 std::move(place), bytes, std::move(then));
  const AdmissionQueue::Enqueued result = worker.shared().admission_queue.enqueue(
      waiting, {limits.max_concurrent_requests, limits.max_queued_requests, limits.max_queued_bytes});
  switch (result) {
    case AdmissionQueue::Enqueued::kQueued:
      waiting->start(limits.queue_timeout);
      return;
    case AdmissionQueue::Enqueued::kGranted:
      waiting->admitted();
      return;
    default:
      break;
  }
  waiting->refuse_now(result, limits);
}

}  // namespace admission_detail



}  // namespace pdr::router::proxy
