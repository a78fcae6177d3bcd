#include <cassert>
#include <cmath>

#include "router/policies/policy.h"

namespace pdr::router {
namespace {

// murmur3's fmix64: the per-(request, node) score must avalanche fully, since HRW takes the max.
uint64_t fmix64(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

uint64_t node_score(uint64_t request_hash, std::string_view key) {
  return fmix64(request_hash ^ affinity_hash(key));
}

// Weighted rendezvous hashing (Schindelhauer & Schomaker): score = w / -ln(u) with u uniform in
// (0, 1) makes a node win with probability w / sum(w), and it keeps HRW's minimal disruption.
double weighted_score(uint64_t score, uint32_t weight) {
  const double u = (static_cast<double>(score >> 11) + 0.5) * 0x1.0p-53;
  return static_cast<double>(weight == 0 ? 1 : weight) / -std::log(u);
}

// Index of the candidate with the highest score. Equal scores only arise from equal keys; they
// are broken by key so the choice never depends on the order of the candidate list.
template <typename ScoreFn>
size_t highest_score(std::span<const Candidate> candidates, ScoreFn score) {
  size_t best = 0;
  auto best_score = score(candidates[0]);
  for (size_t i = 1; i < candidates.size(); ++i) {
    const auto s = score(candidates[i]);
    if (s > best_score || (s == best_score && candidates[i].key < candidates[best].key)) {
      best = i;
      best_score = s;
    }
  }
  return best;
}

class AffinityPolicy final : public Policy {
 public:
  size_t pick(std::span<const Candidate> candidates, const RequestSummary& request) override {
    assert(!candidates.empty());
    if (!request.has_affinity) return fallback_->pick(candidates, request);
    if (candidates.size() == 1) return 0;

    bool uniform_weights = true;
    for (const Candidate& c : candidates) uniform_weights &= c.weight == candidates[0].weight;

    const uint64_t request_hash = request.affinity_hash;
    if (uniform_weights) {
      return highest_score(candidates,
                           [&](const Candidate& c) { return node_score(request_hash, c.key); });
    }
    return highest_score(candidates, [&](const Candidate& c) {
      return weighted_score(node_score(request_hash, c.key), c.weight);
    });
  }
  config::PolicyName name() const override { return config::PolicyName::kAffinity; }

 private:
  std::unique_ptr<Policy> fallback_ = make_least_outstanding_policy();
};

}  // namespace

std::unique_ptr<Policy> make_affinity_policy() { return std::make_unique<AffinityPolicy>(); }

}  // namespace pdr::router
