// Prefix-cache hit rates read from Prometheus text pages before and after a run:
//   router   pdrouter's GET /metrics: pdrouter_cache_routing_matched_units_total /
//            pdrouter_cache_routing_prompt_units_total, by leg and source (units: tokens for the
//            kv_events source, bytes of prompt text for prefix_tree); only a cache_aware policy
//            counts there
//   engine   each node's GET /metrics: vllm:prefix_cache_hits_total /
//            vllm:prefix_cache_queries_total (tokens; vLLM's V1 counters, summed over their labels)
// The differences after - before are the run's. Parsing is pure; scrape() does one GET.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"
#include "router/http/upstream_client.h"
#include "proto/address.h"

namespace pdr::loadgen {

// The sum of every sample of `name` in a Prometheus text page, grouped by the values of
// `group_labels` (the key joins them with '/', a missing label counting as ""; no group labels:
// one key ""). Comment lines, lines over 64 KiB and lines that do not parse are skipped; a
// value that is not a finite number is skipped.
std::map<std::string, double> sum_samples_by(std::string_view page, std::string_view name,
                                             const std::vector<std::string>& group_labels);

// A page's URL, "http://host:port[/path]" (path /metrics when none), the host resolved.
struct ScrapeTarget {
  std::string url;  // as given, for the report
  proto::HostPort address;
  std::string path;
};
Status parse_scrape_target(const std::string& url, ScrapeTarget* out);

// GET the page (at most 32 MiB); an answer other than 200 is an error.
Status scrape(const ScrapeTarget& target, const http::UpstreamTimeouts& timeouts, std::string* page);

// Counters of one kind of cache, summed over the pages of one scrape.
struct CacheCounters {
  std::map<std::string, double> matched;  // router: by "leg/source"; engine: by page URL
  std::map<std::string, double> prompt;
};
CacheCounters router_cache_counters(const std::vector<std::string>& pages);
CacheCounters engine_cache_counters(const std::vector<std::string>& urls,
                                    const std::vector<std::string>& pages);

struct CacheRate {
  double matched = 0, prompt = 0;
  std::optional<double> rate;  // matched / prompt; none when prompt is 0
};
// after - before per key, and over every key.
std::map<std::string, CacheRate> cache_rates(const CacheCounters& before, const CacheCounters& after);
CacheRate total_rate(const std::map<std::string, CacheRate>& rates);
// The router's headline rate, the prefill leg's (else the decode leg's the same way; none
// without lookups):
//   when the kv_events source counted lookups: its matched tokens over `prompt_tokens`, every
//     prompt token the run sent. pdrouter looks a prompt up in its KV block index only when some
//     node is known to hold part of it and sends the rest to its prefix tree, so the source's own
//     ratio would leave out every miss;
//   else the prefix tree's own ratio (bytes of prompt text).
struct RouterRate {
  CacheRate rate;
  std::string source;  // "prefill/kv_events", ... ; empty without lookups
};
RouterRate router_headline_rate(const std::map<std::string, CacheRate>& rates, double prompt_tokens);

// Both kinds of counters from every page, taken before and after a run.
struct CacheSnapshot {
  CacheCounters router, engine;
  std::vector<std::string> errors;  // pages that could not be read (the counters lack them)
};
CacheSnapshot take_snapshot(const std::vector<ScrapeTarget>& routers,
                            const std::vector<ScrapeTarget>& engines,
                            const http::UpstreamTimeouts& timeouts);

// The run's hit rates (after - before).
struct CacheReport {
  double prompt_tokens = 0;                 // every prompt token the run sent (its client count)
  bool router_scraped = false;              // router pages were given
  std::map<std::string, CacheRate> router;  // by "leg/source"
  bool engine_scraped = false;
  std::map<std::string, CacheRate> engine;  // by node page URL
  std::vector<std::string> scrape_errors;   // of either snapshot
};
CacheReport compare_snapshots(bool routers, bool engines, const CacheSnapshot& before,
                              const CacheSnapshot& after);

}  // namespace pdr::loadgen
