#include <atomic>
#include <cassert>

#include "router/policies/policy.h"

namespace pdr::router {
namespace {

class LeastOutstandingPolicy final : public Policy {
 public:
  size_t pick(std::span<const Candidate> candidates, const RequestSummary&) override {
    assert(!candidates.empty());
    size_t best = 0;
    size_t ties = 1;
    for (size_t i = 1; i < candidates.size(); ++i) {
      if (less_loaded(candidates[i], candidates[best])) {
        best = i;
        ties = 1;
      } else if (!less_loaded(candidates[best], candidates[i])) {
        ++ties;
      }
    }
    if (ties == 1) return best;
    // Idle pools tie constantly; always taking the first would pile every burst onto one node.
    // The counter is touched only on ties so the common path has no shared write.
    size_t nth = static_cast<size_t>(tie_counter_.fetch_add(1, std::memory_order_relaxed) % ties);
    for (size_t i = best; i < candidates.size(); ++i) {
      if (!less_loaded(candidates[best], candidates[i]) && nth-- == 0) return i;
    }
    return best;  // unreachable: `ties` candidates at or after `best` are tied with it
  }
  config::PolicyName name() const override { return config::PolicyName::kLeastOutstanding; }

 private:
  std::atomic<uint64_t> tie_counter_{0};
};

}  // namespace

std::unique_ptr<Policy> make_least_outstanding_policy() {
  return std::make_unique<LeastOutstandingPolicy>();
}

}  // namespace pdr::router
