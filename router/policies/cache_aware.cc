#include "router/policies/cache_aware.h"

#include <cassert>

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

}  // namespace pdr::router
