#include "router/routing/multi_turn_counters.h"

#include <utility>

#include "proto/base/metrics_writer.h"
#include "router/routing/conversation_cache.h"

namespace pdr::router::routing {

void write_multi_turn_metrics(MetricsWriter& out, const MultiTurnCounters& mt,
                              const ConversationCache* conversations) {
  using Counter = MultiTurnCounters::Counter;
  auto value = [](const Counter& c) { return static_cast<double>(c.load(std::memory_order_relaxed)); };
  for (const auto& [result, counter] : {std::pair<const char*, const Counter*>{"reused", &mt.reused},
                                        {"no_entry", &mt.no_entry},
                                        {"decode_unavailable", &mt.decode_unavailable},
                                        {"binding_mismatch", &mt.binding_mismatch},
                                        {"anonymous", &mt.anonymous},
                                        {"remote_host_mismatch", &mt.remote_host_mismatch}}) {
    out.counter("pdrouter_multi_turn_turns_total",
                "Requests with a conversation_id (multi_turn.enabled), by whether they reused the last turn's "
                "decode KV",
                value(*counter), {{"result", result}});
  }
  out.counter("pdrouter_multi_turn_stored_total", "Conversation entries stored from a decode's final kv_transfer_params",
              value(mt.stored));
  out.counter("pdrouter_multi_turn_no_params_total",
              "Turns that ended well without usable kv_transfer_params from the decode (nothing stored)",
              value(mt.no_params));
  const ConversationCache::Stats cs = conversations != nullptr ? conversations->stats() : ConversationCache::Stats{};
  out.gauge("pdrouter_multi_turn_entries", "Conversation entries held (multi_turn.max_entries)",
            static_cast<double>(cs.entries));
  out.gauge("pdrouter_multi_turn_bytes", "Bytes of conversation entries held (multi_turn.max_bytes)",
            static_cast<double>(cs.bytes));
  out.counter("pdrouter_multi_turn_expired_total", "Conversation entries dropped after multi_turn.ttl_ms",
              static_cast<double>(cs.expired));
  out.counter("pdrouter_multi_turn_evicted_total",
              "Conversation entries dropped by multi_turn.max_entries / max_bytes", static_cast<double>(cs.evicted));
}

}  // namespace pdr::router::routing
