#include "router/policies/cache_aware.h"

#include <algorithm>
#include <cassert>
#include <vector>

namespace pdr::router {

namespace {

// outstanding / weight as a double: only compared against thresholds here.
double load_of(const Candidate& c) { return static_cast<double>(c.outstanding) / (c.weight == 0 ? 1 : c.weight); }

}  // namespace

std::optional<size_t> pick_by_cache(std::span<const Candidate> candidates, std::span<const uint32_t> cached_tokens,
                                    uint32_t prompt_tokens, const CacheAwareRule& rule) {
  assert(candidates.size() == cached_tokens.size());
  if (candidates.empty() || prompt_tokens == 0) return std::nullopt;
  size_t best = 0;
  size_t least = 0;
  for (size_t i = 1; i < candidates.size(); ++i) {
    if (cached_tokens[i] > cached_tokens[best] ||
        (cached_tokens[i] == cached_tokens[best] && less_loaded(candidates[i], candidates[best]))) {
      best = i;
    }
    if (less_loaded(candidates[i], candidates[least])) least = i;
  }
  if (cached_tokens[best] == 0) return std::nullopt;
  const double best_load = load_of(candidates[best]);
  const double least_load = load_of(candidates[least]);
  if (best_load - least_load > rule.balance_abs_threshold && best_load > rule.balance_rel_threshold * least_load) {
    return std::nullopt;  // rule 1: the cache is not worth the queue
  }
  if (static_cast<double>(cached_tokens[best]) < rule.min_match_ratio * prompt_tokens) return std::nullopt;
  return best;
}

uint32_t CacheHits::matched(std::string_view key) const {
  for (const Node& n : nodes) {
    if (n.key == key) return n.matched;
  }
  return 0;
}

namespace {

class CacheAwarePolicy final : public Policy {
 public:
  explicit CacheAwarePolicy(const config::Topology::Policies::CacheAware& config)
      : rule_{config.min_match_percent / 100.0, config.balance_abs_threshold, config.balance_rel_percent / 100.0},
        by_load_(make_least_outstanding_policy()) {}

  size_t pick(std::span<const Candidate> candidates, const RequestSummary& request) override {
    assert(!candidates.empty());
    if (request.cache != nullptr && !request.cache->nodes.empty() && candidates.size() > 1) {
      // A few nodes hold a prefix, among a handful of candidates: a linear lookup per candidate.
      thread_local std::vector<uint32_t> cached;
      cached.clear();
      for (const Candidate& c : candidates) cached.push_back(request.cache->matched(c.key));
      if (auto best = pick_by_cache(candidates, cached, request.cache->prompt_units, rule_)) return *best;
    }
    return by_load_->pick(candidates, request);
  }
  config::PolicyName name() const override { return config::PolicyName::kCacheAware; }

 private:
  const CacheAwareRule rule_;
  std::unique_ptr<Policy> by_load_;
};

}  // namespace

std::unique_ptr<Policy> make_cache_aware_policy(const config::Topology::Policies::CacheAware& config) {
  return std::make_unique<CacheAwarePolicy>(config);
}

}  // namespace pdr::router
