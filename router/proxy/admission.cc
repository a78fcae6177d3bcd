#include "router/proxy/admission.h"

#include <string>

#include "router/proxy/client_api.h"

namespace pdr::router::proxy {

AdmissionSlot& AdmissionSlot::operator=(AdmissionSlot&& other) noexcept {
  if (this != &other) {
    release();
    counters_ = other.counters_;
    bytes_ = other.bytes_;
    other.counters_ = nullptr;
  }
  return *this;
}

void AdmissionSlot::release() {
  if (counters_ == nullptr) return;
  if (bytes_ != 0) counters_->buffered.release(bytes_);
  counters_->in_flight.fetch_sub(1, std::memory_order_relaxed);
  counters_ = nullptr;
}

bool refuse_while_shutting_down(ProxyShared& shared, http::ResponseWriter& writer, std::string_view path,
                                Answered* answered) {
  if (!shared.shutting_down.load(std::memory_order_relaxed)) return false;
  shared.counters.refuse(Refusal::kShuttingDown);
  http::Response r = api_error_response(path, 503, "pdrouter is shutting down", "server_error", "shutting_down");
  if (answered != nullptr) *answered = {r.status, r.body.size()};
  writer.send(std::move(r));
  return true;
}

std::optional<AdmissionSlot> take_admission_slot(WorkerContext& worker, http::Request& request, size_t leg_copies,
                                                 http::ResponseWriter& writer, Answered* answered) {
  ProxyCounters& counters = worker.counters();
  const auto& limits = worker.topology()->limits;
  const auto limit = static_cast<int64_t>(limits.max_concurrent_requests);
  // Orphaned prefill legs (orphan_legs.h) are not counted here: a prefill that never answers
  // would turn every request into an orphan holding a client's slot, and a handful of clients
  // would be refused most of the time. limits.max_orphan_legs_per_node bounds them instead.
  // Both refusals give the slot back and ask the client to retry in a second.
  auto refuse_for_now = [&](Refusal why, int status, const std::string& message, const char* type,
                            const char* code) {
    counters.in_flight.fetch_sub(1, std::memory_order_relaxed);
    counters.refuse(why);
    http::Response r = api_error_response(request.path, status, message, type, code);
    r.headers.push_back({"Retry-After", "1"});
    if (answered != nullptr) *answered = {r.status, r.body.size()};
    writer.send(std::move(r));
    return std::nullopt;
  };
  if (counters.in_flight.fetch_add(1, std::memory_order_relaxed) >= limit) {
    return refuse_for_now(Refusal::kTooBusy, 429,
                          "too many requests in flight (limits.max_concurrent_requests = " +
                              std::to_string(limit) + ")",
                          "rate_limit_error", "too_many_requests");
  }
  // The body stays in memory while the request is served (a P/D request renders retries from it;
  // a one-node request holds it until the node has it), and each leg's wire copy while it is
  // written: all of it takes its share of limits.max_buffered_bytes, shared by every worker.
  // The server charged the body's buffer already (a server without a budget, in tests: charged
  // here).
  const uint32_t budget = limits.max_buffered_bytes;
  const size_t charged = request.body_charge.bytes();
  const size_t buffer = charged != 0 || request.body.empty() ? 0 : request.body.capacity();
  const size_t extra = buffer + leg_copies * request.body.size();
  if (!counters.buffered.reserve(extra, budget)) {
    return refuse_for_now(Refusal::kMemoryBudget, 503,
                          "pdrouter is holding too many request bytes (limits.max_buffered_bytes = " +
                              std::to_string(budget) + ")",
                          "server_error", "memory_budget");
  }
  request.body_charge.take();  // its bytes are the slot's now
  return AdmissionSlot(counters, charged + extra);
}

}  // namespace pdr::router::proxy
