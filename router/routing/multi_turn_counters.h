// What multi-turn KV reuse (multi_turn.h) counts, and its /metrics section. A member of
// ProxyCounters (router/proxy/proxy_counters.h), bumped by every HTTP worker with relaxed atomics.
#pragma once

#include <atomic>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::routing {

class ConversationCache;

// Turns that reused the last turn's decode KV, turns whose conversation had no live entry,
// entries whose decode could not be paired, entries stored, and turns that ended without usable
// kv_transfer_params from the decode. binding_mismatch: no entry of this client, but other
// clients hold the conversation_id; anonymous: no credential while multi_turn.allow_anonymous is
// false (no reuse); remote_host_mismatch: the entry's remote_host is not the decode's own host
// (proto::check_next_turn_remote_host; no reuse).
struct MultiTurnCounters {
  using Counter = std::atomic<uint64_t>;
  Counter reused{0}, no_entry{0}, decode_unavailable{0}, stored{0}, no_params{0};
  Counter binding_mismatch{0}, anonymous{0}, remote_host_mismatch{0};
};

// pdrouter_multi_turn_*: the counters above, then the size of `conversations` (null: zeros).
void write_multi_turn_metrics(MetricsWriter& out, const MultiTurnCounters& counters,
                              const ConversationCache* conversations);

}  // namespace pdr::router::routing
