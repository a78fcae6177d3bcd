#include <atomic>
#include <cassert>

#include "router/policies/policy.h"

namespace pdr::router {
namespace {

// Uniform in [0, n) from 32 random bits by multiply-shift (Lemire); bias is n / 2^32, far below
// anything load balancing can notice for realistic pool sizes.
size_t bounded(uint32_t random, size_t n) {
  return static_cast<size_t>((uint64_t{random} * n) >> 32);
}

class PowerOfTwoPolicy final : public Policy {
 public:
  explicit PowerOfTwoPolicy(uint64_t seed) : state_(seed) {}

  size_t pick(std::span<const Candidate> candidates, const RequestSummary&) override {
    assert(!candidates.empty());
    const size_t n = candidates.size();
    if (n == 1) return 0;
    const uint64_t r = next_random();
    const size_t first = bounded(static_cast<uint32_t>(r >> 32), n);
    size_t second = bounded(static_cast<uint32_t>(r), n - 1);
    if (second >= first) ++second;  // distinct from `first`, still uniform over the rest
    return less_loaded(candidates[second], candidates[first]) ? second : first;
  }
  config::PolicyName name() const override { return config::PolicyName::kPowerOfTwo; }

 private:
  // splitmix64: the state is a Weyl sequence, so a relaxed fetch_add makes the generator
  // lock-free and safe to share; each caller gets a distinct state to finalise.
  uint64_t next_random() {
    constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_.fetch_add(kGamma, std::memory_order_relaxed) + kGamma;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  std::atomic<uint64_t> state_;
};

}  // namespace

std::unique_ptr<Policy> make_power_of_two_policy(uint64_t seed) {
  return std::make_unique<PowerOfTwoPolicy>(seed);
}

}  // namespace pdr::router
