#include "router/routing/cache_routing_counters.h"

#include <algorithm>
#include <string>

#include "proto/base/metrics_writer.h"
#include "router/routing/cache_tokenize.h"

namespace pdr::router::routing {

static_assert(std::tuple_size_v<CacheTokenizeCounters> == kTokenizeResultCount);

namespace {

double value(const std::atomic<uint64_t>& c) { return static_cast<double>(c.load(std::memory_order_relaxed)); }

}  // namespace

void write_cache_routing_metrics(MetricsWriter& out, const CacheRoutingCounters& cr) {
  // Requests by whether the chosen node held part of the prompt, and how much.
  for (size_t l = 0; l < 2; ++l) {
    for (size_t source = 0; source < 2; ++source) {
      const std::string leg_name = l == 0 ? "prefill" : "decode";
      const std::string source_name = source == 0 ? "kv_events" : "prefix_tree";
      const uint64_t hits = cr.hits[l][source].load(std::memory_order_relaxed);
      const uint64_t requests = cr.requests[l][source].load(std::memory_order_relaxed);
      out.counter("pdrouter_cache_routing_requests_total",
                  "Legs routed with a cache lookup (cache_aware), by leg, source and whether the chosen node "
                  "held part of the prompt",
                  static_cast<double>(hits), {{"leg", leg_name}, {"source", source_name}, {"result", "hit"}});
      out.counter("pdrouter_cache_routing_requests_total",
                  "Legs routed with a cache lookup (cache_aware), by leg, source and whether the chosen node "
                  "held part of the prompt",
                  static_cast<double>(requests - std::min(hits, requests)),
                  {{"leg", leg_name}, {"source", source_name}, {"result", "miss"}});
      out.counter("pdrouter_cache_routing_matched_units_total",
                  "Prompt units (tokens for kv_events, bytes for prefix_tree) the chosen node held",
                  value(cr.matched_units[l][source]), {{"leg", leg_name}, {"source", source_name}});
      out.counter("pdrouter_cache_routing_prompt_units_total",
                  "Prompt units (tokens for kv_events, bytes for prefix_tree) of the legs routed with a cache "
                  "lookup; matched / prompt is the prefix hit rate",
                  value(cr.prompt_units[l][source]), {{"leg", leg_name}, {"source", source_name}});
    }
  }
}

void write_cache_tokenize_metrics(MetricsWriter& out, const CacheTokenizeCounters& counters) {
  for (size_t r = 0; r < counters.size(); ++r) {
    out.counter("pdrouter_cache_tokenize_total",
                "Text prompts sent to a node's /tokenize for an exact cache lookup (policies.cache_aware.tokenize: "
                "node), by result; every result but matched fell back to the prefix tree",
                value(counters[r]), {{"result", std::string(to_string(static_cast<TokenizeResult>(r)))}});
  }
}

}  // namespace pdr::router::routing
