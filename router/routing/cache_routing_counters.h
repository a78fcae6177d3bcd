// What cache-aware routing (cache_routing.h) and its node tokenization (cache_tokenize.h) count,
// and their /metrics sections. Members of ProxyCounters (router/proxy/proxy_counters.h), bumped by every HTTP
// worker with relaxed atomics.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::routing {

// Per [leg: 0 prefill, 1 decode][source: 0 kv_events, 1 prefix_tree]: requests routed with a cache lookup, those whose
// chosen node held part of the prompt, and the prompt units (tokens or bytes) it held out of
// those sent: matched / prompt is the prefix hit rate.
struct CacheRoutingCounters {
  using Counter = std::atomic<uint64_t>;
  std::array<std::array<Counter, 2>, 2> requests{}, hits{}, matched_units{}, prompt_units{};
};

// Text prompts tokenized by a node for the cache lookup, by TokenizeResult (cache_tokenize.h).
using CacheTokenizeCounters = std::array<std::atomic<uint64_t>, 9>;

// pdrouter_cache_routing_*: hits and misses, matched and prompt units, by leg and source.
void write_cache_routing_metrics(MetricsWriter& out, const CacheRoutingCounters& counters);
// pdrouter_cache_tokenize_total{result}.
void write_cache_tokenize_metrics(MetricsWriter& out, const CacheTokenizeCounters& counters);

}  // namespace pdr::router::routing
