// pdrouter-bench's output: the human table (the layout of `vllm bench serve`, plus failures and
// their reasons) and the JSON result (vLLM's keys, plus pdrouter-bench's own: "failed" reasons
// counted in "error_counts", the observed concurrency, the target). Pure.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "bench/loadgen/bench_metrics.h"
#include "bench/loadgen/metrics_scrape.h"
#include "bench/loadgen/slo_metrics.h"

namespace pdr::loadgen {

// What was run, as the report states it.
struct RunInfo {
  std::string date;       // local time, "YYYYMMDD-HHMMSS" as vLLM names result files
  std::string backend;    // "vllm" / "openai" (completions) or "openai-chat"
  std::string base_url;   // "http://host:port"
  std::string endpoint;   // "/v1/completions"
  std::string model;
  uint32_t num_prompts = 0;
  uint32_t input_len = 0;
  uint32_t output_len = 0;
  double range_ratio = 0;
  double request_rate = 0;  // infinity: all at once
  double burstiness = 1;
  std::optional<uint32_t> max_concurrency;
  uint64_t seed = 0;
  bool interrupted = false;  // Ctrl-C: the numbers cover what finished
};

std::string render_table(const RunInfo& info, const BenchSummary& summary);

// With the per-request lists vLLM saves (input_lens, output_lens, ttfts, itls, errors) in
// request order, seconds as vLLM stores them.
nlohmann::json result_json(const RunInfo& info, const BenchSummary& summary,
                           const std::vector<RequestResult>& results);

// The SLO section (slo_metrics.h): objectives, requests meeting them, attainment, goodput, TBT
// mean / median / percentiles, failed requests by HTTP status (429 and 503 always shown).
std::string render_slo_table(const SloSummary& slo);
// Adds slo_ttft_ms, slo_tbt_ms, slo_requests, slo_met, slo_met_ttft, slo_met_tbt,
// slo_attainment, goodput (requests/s), mean/median/std/pNN_tbt_ms, failed_http_status
// ({"429": n, ...}), http_429, http_503, and "tbts" (each request's TBT in seconds, 0 when it
// failed) in request order.
void add_slo_json(const SloSummary& slo, const std::vector<RequestResult>& results,
                  nlohmann::json* out);

// Prefix-cache hit rates over the run (metrics_scrape.h), a row each; "n/a" without lookups.
std::string render_cache_table(const CacheReport& cache);
// Adds router_prefix_hit_rate (router_headline_rate) with router_prefix_hit_source, and
// engine_prefix_hit_rate (null when not scraped or no lookup),
// router_cache / engine_cache ({key: {matched, prompt, hit_rate}}) and scrape_errors.
void add_cache_json(const CacheReport& cache, nlohmann::json* out);

}  // namespace pdr::loadgen
