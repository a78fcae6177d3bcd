// The router's side of a dialect's pre-step (proto/dialects/dialect.h, Dialect::pre_step): work
// done once a pair is chosen and before its legs are built, described by the dialect as a value
// and run here, so the request session runs it without naming the dialect.
//
//   kNone                 done(OK) at once, nothing learned.
//   kPrefillEngineQuery   Mooncake: the prefill's bootstrap /query table (DP rank -> engine_id,
//                         docs/design/wire-formats.md 4) from the worker's cache (mooncake_cache.h). The
//                         prefill's own table says how many DP ranks it has (the reference proxy's
//                         dp_size = len(/query)): when that differs from the registered dp_size,
//                         the rank is chosen again over the table's ranks, so a topology entry
//                         that left dp_size out does not leave a multi-rank prefill unpinned.
//                         Counted in BootstrapQueryCounters (pre_step_counters.h).
//
// Worker thread only; `done` runs on the worker, possibly inside run_pre_step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "proto/base/status.h"
#include "discovery/instance.h"
#include "proto/dialects/dialect.h"
#include "router/routing/routing_worker.h"

namespace pdr::router::routing {

// What a pre-step learned about the chosen prefill, for the leg builder (proto::LegInstance).
struct PrefillFacts {
  std::string engine_id;                  // LegInstance::mooncake_engine_id
  uint32_t dp_size = 0;                   // DP ranks the prefill reported; 0: not asked
  std::optional<uint32_t> prefill_rank;   // the prefill's DP rank to use from now on
};

// Not OK: the pre-step failed (the message says why; the session fails the prefill leg with
// LegFailure::kBootstrap).
using PreStepDone = std::function<void(const Status& status, const PrefillFacts& facts)>;

void run_pre_step(const proto::Dialect& dialect, RoutingWorker& worker, const config::Topology& topology,
                  std::shared_ptr<const discovery::Instance> prefill, std::optional<uint32_t> prefill_rank,
                  PreStepDone done);

// A leg on `prefill` failed: whatever the pre-step cached about it is stale.
void forget_pre_step(const proto::Dialect& dialect, RoutingWorker& worker, const discovery::Instance& prefill);

}  // namespace pdr::router::routing
