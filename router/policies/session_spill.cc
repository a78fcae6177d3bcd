#include "router/policies/session_spill.h"

namespace pdr::router {

namespace {

double per_weight(const SessionNodeLoad& n) { return static_cast<double>(n.requests) / (n.weight == 0 ? 1 : n.weight); }

}  // namespace

bool sticky_overloaded(const SessionNodeLoad& sticky, std::span<const SessionNodeLoad> alternatives,
                       const SpillMargins& margins) {
  const double sticky_requests = per_weight(sticky);
  for (const SessionNodeLoad& other : alternatives) {
    // Seconds of queue compare only between nodes whose rates are both measured (an unmeasured
    // node's queue is not zero, only unknown). They replace the request count there: a prefill's
    // requests stay charged while their decodes run, so its count overstates what it has to do.
    if (sticky.queue_seconds >= 0 && other.queue_seconds >= 0) {
      if (sticky.queue_seconds - other.queue_seconds > margins.queue_seconds) return true;
      continue;
    }
    if (sticky_requests - per_weight(other) > static_cast<double>(margins.requests)) return true;
  }
  return false;
}

}  // namespace pdr::router
