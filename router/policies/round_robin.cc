#include <atomic>
#include <cassert>

#include "router/policies/policy.h"

namespace pdr::router {
namespace {

class RoundRobinPolicy final : public Policy {
 public:
  size_t pick(std::span<const Candidate> candidates, const RequestSummary&) override {
    assert(!candidates.empty());
    // A 64-bit counter never wraps in practice, so the modulo stays fair forever.
    return static_cast<size_t>(next_.fetch_add(1, std::memory_order_relaxed) % candidates.size());
  }
  config::PolicyName name() const override { return config::PolicyName::kRoundRobin; }

 private:
  std::atomic<uint64_t> next_{0};
};

}  // namespace

std::unique_ptr<Policy> make_round_robin_policy() { return std::make_unique<RoundRobinPolicy>(); }

}  // namespace pdr::router
