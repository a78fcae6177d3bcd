#include "router/routing/pre_step.h"

#include <utility>

#include "router/routing/mooncake_cache.h"
#include "router/routing/pairing.h"
#include "router/routing/pre_step_counters.h"

namespace pdr::router::routing {

namespace {

void query_prefill_engines(RoutingWorker& w, const config::Topology& topology,
                           std::shared_ptr<const discovery::Instance> instance, std::optional<uint32_t> prefill_rank,
                           PreStepDone done) {
  const uint16_t port = instance->bootstrap_port.value_or(topology.connectors.mooncake_bootstrap_port);
  http::UpstreamTimeouts timeouts{topology.timeouts.connect, topology.timeouts.prefill, topology.timeouts.prefill};
  const discovery::Instance& prefill = *instance;
  w.mooncake().get(prefill, port, timeouts,
                   [&w, instance, prefill_rank, done = std::move(done)](const Status& status,
                                                                         const proto::MooncakeEngines* engines) {
                     if (!status.is_ok()) {
                       w.bootstrap_queries().failed.fetch_add(1, std::memory_order_relaxed);
                       done(status, PrefillFacts{});
                       return;
                     }
                     w.bootstrap_queries().ok.fetch_add(1, std::memory_order_relaxed);
                     PrefillFacts facts;
                     facts.prefill_rank = prefill_rank;
                     const auto ranks = static_cast<uint32_t>(engines->engine_ids.size());
                     if (ranks != instance->dp_size) facts.prefill_rank = next_dp_rank(*instance, ranks);
                     facts.dp_size = ranks;
                     const uint32_t rank = facts.prefill_rank.value_or(0);
                     if (rank >= ranks) {
                       done(Status(StatusCode::kRejected, "prefill " + instance->key + " bootstrap lists " +
                                                              std::to_string(ranks) + " DP rank(s), rank " +
                                                              std::to_string(rank) + " wanted"),
                            facts);
                       return;
                     }
                     facts.engine_id = engines->engine_ids[rank];
                     done(Status::ok(), facts);
                   });
}

}  // namespace

void run_pre_step(const proto::Dialect& dialect, RoutingWorker& worker, const config::Topology& topology,
                  std::shared_ptr<const discovery::Instance> prefill, std::optional<uint32_t> prefill_rank,
                  PreStepDone done) {
  switch (dialect.pre_step) {
    case proto::PreStep::kNone: {
      PrefillFacts facts;
      facts.prefill_rank = prefill_rank;
      done(Status::ok(), facts);
      return;
    }
    case proto::PreStep::kPrefillEngineQuery:
      query_prefill_engines(worker, topology, std::move(prefill), prefill_rank, std::move(done));
      return;
  }
}

void forget_pre_step(const proto::Dialect& dialect, RoutingWorker& worker, const discovery::Instance& prefill) {
  if (dialect.pre_step == proto::PreStep::kPrefillEngineQuery) worker.mooncake().invalidate(prefill.key);
}

}  // namespace pdr::router::routing
