// When a session's bound node is too loaded to keep (router/routing/session_affinity.h): the
// spill rule, a pure comparison of load figures the caller reads from the nodes' load ledgers
// (discovery/load_ledger.h). Kept apart so that another load measure (a predicted latency) can
// replace it without touching the binding table or the session.
//
// Stickiness that ignores load piles a hot session (or many sessions hashed alike) onto one
// saturated node while the others idle; a margin lets a session stay through ordinary
// imbalance (its KV is worth some queueing) but not through a pile-up.
//
// Pure; any thread.
#pragma once

#include <cstdint>
#include <span>

namespace pdr::router {

// One node's load, as the spill rule compares it.
struct SessionNodeLoad {
  uint32_t requests = 0;  // requests pdrouter has in flight on the node
  uint32_t weight = 1;    // dp_size (0 is taken as 1)
  // Seconds of queued uncached prompt tokens at the node's measured prefill rate (queued tokens
  // over tokens a second); negative: not known (no rate measured yet, or a decode).
  double queue_seconds = -1;
};

struct SpillMargins {
  uint32_t requests = 4;       // in flight per unit of weight
  double queue_seconds = 2.0;  // of queued prefill work
};

// True when `sticky` carries more load than some alternative by more than a margin: where both
// queue figures are known (prefills with measured rates), more seconds of queue than the
// queue_seconds margin; otherwise more requests in flight per unit of weight than the requests
// margin. No alternatives: false (nowhere to go).
bool sticky_overloaded(const SessionNodeLoad& sticky, std::span<const SessionNodeLoad> alternatives,
                       const SpillMargins& margins);

}  // namespace pdr::router
