// A budget for request bodies held in memory, shared by every worker of a server and by the
// handler side that keeps the bodies afterwards (the router's limits.max_buffered_bytes).
//
// The server charges a body as it buffers it, by the capacity of its buffer: the whole
// Content-Length before the first body byte is read (so a body over the budget is never read:
// 503 memory_budget, Retry-After: 1, the connection closed), a chunked body each time its buffer
// grows. The charge travels with the request (Request::body_charge): the handler takes it over
// (BodyCharge::take) to give the bytes back when it lets go of the body, or the charge gives them
// back when the request is destroyed.
//
// Thread-safe: implementations are called from every worker thread at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

namespace pdr::http {

class BodyBudget {
 public:
  virtual ~BodyBudget() = default;
  // Takes `bytes` for a body buffered on `worker`; false (nothing taken) when that would go
  // over the budget (the implementation counts the refusal).
  virtual bool reserve(uint32_t worker, size_t bytes) = 0;
  virtual void release(size_t bytes) = 0;
};

// One request body's share of a BodyBudget. Movable, not copyable; gives its bytes back when
// destroyed unless taken.
class BodyCharge {
 public:
  BodyCharge() = default;
  BodyCharge(BodyCharge&& other) noexcept
      : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  BodyCharge& operator=(BodyCharge&& other) noexcept {
    if (this != &other) {
      reset();
      budget_ = std::exchange(other.budget_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  BodyCharge(const BodyCharge&) = delete;
  BodyCharge& operator=(const BodyCharge&) = delete;
  ~BodyCharge() { reset(); }

  // Grows the charge to `bytes` in total (nothing when it holds that much already); false when
  // the budget refused the growth (the charge is unchanged).
  bool grow_to(BodyBudget* budget, uint32_t worker, size_t bytes) {
    if (bytes <= bytes_) return true;
    if (!budget->reserve(worker, bytes - bytes_)) return false;
    budget_ = budget;
    bytes_ = bytes;
    return true;
  }
  size_t bytes() const { return bytes_; }
  bool held() const { return budget_ != nullptr; }
  // The caller now owns the bytes (and gives them back to the budget itself); this holds nothing.
  size_t take() {
    budget_ = nullptr;
    return std::exchange(bytes_, 0);
  }
  void reset() {
    if (budget_ != nullptr && bytes_ != 0) budget_->release(bytes_);
    budget_ = nullptr;
    bytes_ = 0;
  }

 private:
  BodyBudget* budget_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace pdr::http
