#include "bench/loadgen/bench_report.h"

#include <cmath>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace pdr::loadgen {
namespace {

// "99" for 99.0, "99.9" for 99.9: how vLLM names percentile keys and rows.
std::string percentile_name(double p) {
  return p == std::floor(p) ? fmt::format("{}", static_cast<int64_t>(p)) : fmt::format("{}", p);
}

void row(std::string& out, std::string_view label, std::string_view value) {
  fmt::format_to(std::back_inserter(out), "{:<40}{:<10}\n", label, value);
}

// The title centred in a 50-column rule of `fill`, as vLLM prints its headings (the top one
// with a space either side, the sections without).
void heading(std::string& out, std::string_view title, char fill) {
  const std::string padded = fill == '=' ? fmt::format(" {} ", title) : std::string(title);
  const size_t width = 50, text = padded.size();
  const size_t left = text >= width ? 0 : (width - text) / 2;
  const size_t right = text >= width ? 0 : width - text - left;
  out.append(left, fill).append(padded).append(right, fill).push_back('\n');
}

void distribution_rows(std::string& out, std::string_view title, std::string_view name,
                       const Distribution& d) {
  heading(out, title, '-');
  row(out, fmt::format("Mean {} (ms):", name), fmt::format("{:.2f}", d.mean));
  row(out, fmt::format("Median {} (ms):", name), fmt::format("{:.2f}", d.median));
  for (const auto& [p, value] : d.percentiles) {
    row(out, fmt::format("P{} {} (ms):", percentile_name(p), name), fmt::format("{:.2f}", value));
  }
}

void distribution_json(nlohmann::json& out, std::string_view name, const Distribution& d) {
  out[fmt::format("mean_{}_ms", name)] = d.mean;
  out[fmt::format("median_{}_ms", name)] = d.median;
  out[fmt::format("std_{}_ms", name)] = d.stddev;
  for (const auto& [p, value] : d.percentiles) {
    out[fmt::format("p{}_{}_ms", percentile_name(p), name)] = value;
  }
}

std::string rate_text(double rate) {
  return std::isinf(rate) || rate <= 0 ? "inf" : fmt::format("{}", rate);
}

}  // namespace

std::string render_table(const RunInfo& info, const BenchSummary& s) {
  std::string out;
  heading(out, info.interrupted ? "Serving Benchmark Result (INTERRUPTED)" : "Serving Benchmark Result",
          '=');
  row(out, "Target:", info.base_url + info.endpoint);
  row(out, "Traffic request rate:", rate_text(info.request_rate));
  row(out, "Burstiness factor:", fmt::format("{}", info.burstiness));
  if (info.max_concurrency) row(out, "Maximum request concurrency:", fmt::format("{}", *info.max_concurrency));
  row(out, "Observed peak concurrency:", fmt::format("{}", s.max_concurrency_observed));
  row(out, "Successful requests:", fmt::format("{}", s.completed));
  row(out, "Failed requests:", fmt::format("{}", s.failed));
  row(out, "Benchmark duration (s):", fmt::format("{:.2f}", s.duration_s));
  row(out, "Total input tokens:", fmt::format("{}", s.total_input_tokens));
  row(out, "Total generated tokens:", fmt::format("{}", s.total_output_tokens));
  row(out, "Request throughput (req/s):", fmt::format("{:.2f}", s.request_throughput));
  row(out, "Output token throughput (tok/s):", fmt::format("{:.2f}", s.output_throughput));
  row(out, "Total Token throughput (tok/s):", fmt::format("{:.2f}", s.total_token_throughput));
  distribution_rows(out, "Time to First Token", "TTFT", s.ttft_ms);
  distribution_rows(out, "Time per Output Token (excl. 1st token)", "TPOT", s.tpot_ms);
  distribution_rows(out, "Inter-token Latency", "ITL", s.itl_ms);
  distribution_rows(out, "End-to-end Latency", "E2EL", s.e2el_ms);
  if (!s.errors.empty()) {
    heading(out, "Errors", '-');
    for (const auto& [message, count] : s.errors) {
      fmt::format_to(std::back_inserter(out), "{:>6} x {}\n", count, message);
    }
  }
  out.append(50, '=');
  out.push_back('\n');
  return out;
}

nlohmann::json result_json(const RunInfo& info, const BenchSummary& s,
                           const std::vector<RequestResult>& results) {
  nlohmann::json out;
  out["date"] = info.date;
  out["backend"] = info.backend;
  out["base_url"] = info.base_url;
  out["endpoint"] = info.endpoint;
  out["model_id"] = info.model;
  out["num_prompts"] = info.num_prompts;
  out["random_input_len"] = info.input_len;
  out["random_output_len"] = info.output_len;
  out["random_range_ratio"] = info.range_ratio;
  // JSON has no infinity; vLLM's own files spell it "inf" too.
  if (std::isinf(info.request_rate) || info.request_rate <= 0) {
    out["request_rate"] = "inf";
  } else {
    out["request_rate"] = info.request_rate;
  }
  out["burstiness"] = info.burstiness;
  out["max_concurrency"] = info.max_concurrency ? nlohmann::json(*info.max_concurrency) : nlohmann::json();
  out["seed"] = info.seed;
  out["interrupted"] = info.interrupted;
  out["duration"] = s.duration_s;
  out["completed"] = s.completed;
  out["failed"] = s.failed;
  out["max_concurrency_observed"] = s.max_concurrency_observed;
  out["total_input_tokens"] = s.total_input_tokens;
  out["total_output_tokens"] = s.total_output_tokens;
  out["request_throughput"] = s.request_throughput;
  out["output_throughput"] = s.output_throughput;
  out["total_token_throughput"] = s.total_token_throughput;
  distribution_json(out, "ttft", s.ttft_ms);
  distribution_json(out, "tpot", s.tpot_ms);
  distribution_json(out, "itl", s.itl_ms);
  distribution_json(out, "e2el", s.e2el_ms);
  nlohmann::json counts = nlohmann::json::object();
  for (const auto& [message, count] : s.errors) counts[message] = count;
  out["error_counts"] = std::move(counts);

  auto& input_lens = out["input_lens"] = nlohmann::json::array();
  auto& output_lens = out["output_lens"] = nlohmann::json::array();
  auto& ttfts = out["ttfts"] = nlohmann::json::array();
  auto& itls = out["itls"] = nlohmann::json::array();
  auto& errors = out["errors"] = nlohmann::json::array();
  for (const RequestResult& r : results) {
    input_lens.push_back(r.input_len);
    output_lens.push_back(r.success ? r.output_tokens : 0);
    ttfts.push_back(r.success ? r.ttft_s : 0.0);
    itls.push_back(r.itl_s);
    errors.push_back(r.error);
  }
  return out;
}

std::string render_slo_table(const SloSummary& slo) {
  std::string out;
  heading(out, "SLO attainment", '-');
  row(out, "TTFT objective (ms):", fmt::format("{:.2f}", slo.slo.ttft_s * 1e3));
  row(out, "TBT objective (ms):", fmt::format("{:.2f}", slo.slo.tbt_s * 1e3));
  row(out, "Requests meeting TTFT:", fmt::format("{}", slo.met_ttft));
  row(out, "Requests meeting TBT:", fmt::format("{}", slo.met_tbt));
  row(out, "Requests meeting both:", fmt::format("{} of {}", slo.met, slo.requests));
  row(out, "SLO attainment (%):", fmt::format("{:.2f}", slo.attainment * 100));
  row(out, "Goodput (req/s):", fmt::format("{:.3f}", slo.goodput));
  distribution_rows(out, "Time between Tokens (slowest 10% mean)", "TBT", slo.tbt_ms);
  heading(out, "Failed requests by HTTP status", '-');
  std::map<int, uint32_t> statuses = slo.failed_statuses;
  statuses.try_emplace(429, 0);
  statuses.try_emplace(503, 0);
  for (const auto& [status, count] : statuses) {
    row(out, fmt::format("HTTP {}:", status), fmt::format("{}", count));
  }
  return out;
}

void add_slo_json(const SloSummary& slo, const std::vector<RequestResult>& results,
                  nlohmann::json* out) {
  nlohmann::json& o = *out;
  o["slo_ttft_ms"] = slo.slo.ttft_s * 1e3;
  o["slo_tbt_ms"] = slo.slo.tbt_s * 1e3;
  o["slo_requests"] = slo.requests;
  o["slo_met"] = slo.met;
  o["slo_met_ttft"] = slo.met_ttft;
  o["slo_met_tbt"] = slo.met_tbt;
  o["slo_attainment"] = slo.attainment;
  o["goodput"] = slo.goodput;
  distribution_json(o, "tbt", slo.tbt_ms);
  nlohmann::json statuses = nlohmann::json::object();
  for (const auto& [status, count] : slo.failed_statuses) statuses[std::to_string(status)] = count;
  o["failed_http_status"] = std::move(statuses);
  const auto count_of = [&](int status) {
    const auto it = slo.failed_statuses.find(status);
    return it == slo.failed_statuses.end() ? 0u : it->second;
  };
  o["http_429"] = count_of(429);
  o["http_503"] = count_of(503);
  auto& tbts = o["tbts"] = nlohmann::json::array();
  for (const RequestResult& r : results) tbts.push_back(r.success ? slowest_tenth_mean(r.itl_s) : 0.0);
}

namespace {

std::string rate_text(const CacheRate& r) {
  return r.rate ? fmt::format("{:.2f}", *r.rate * 100) : "n/a";
}

nlohmann::json rate_json(const CacheRate& r) {
  return {{"matched", r.matched}, {"prompt", r.prompt},
          {"hit_rate", r.rate ? nlohmann::json(*r.rate) : nlohmann::json()}};
}

}  // namespace

std::string render_cache_table(const CacheReport& cache) {
  std::string out;
  if (!cache.router_scraped && !cache.engine_scraped && cache.scrape_errors.empty()) return out;
  heading(out, "Prefix cache hit rate", '-');
  if (cache.router_scraped) {
    const RouterRate headline = router_headline_rate(cache.router, cache.prompt_tokens);
    row(out, fmt::format("Router, {} (%):", headline.source.empty() ? "no lookup" : headline.source),
        rate_text(headline.rate));
    for (const auto& [key, r] : cache.router) {
      if (r.prompt > 0) row(out, fmt::format("Router {}, own lookups (%):", key), rate_text(r));
    }
  }
  if (cache.engine_scraped) row(out, "Engines (%):", rate_text(total_rate(cache.engine)));
  for (const std::string& error : cache.scrape_errors) {
    fmt::format_to(std::back_inserter(out), "scrape failed: {}\n", error);
  }
  return out;
}

void add_cache_json(const CacheReport& cache, nlohmann::json* out) {
  nlohmann::json& o = *out;
  const RouterRate router = router_headline_rate(cache.router, cache.prompt_tokens);
  const CacheRate engine = total_rate(cache.engine);
  o["router_prefix_hit_rate"] =
      cache.router_scraped && router.rate.rate ? nlohmann::json(*router.rate.rate) : nlohmann::json();
  o["router_prefix_hit_source"] = router.source;
  o["engine_prefix_hit_rate"] =
      cache.engine_scraped && engine.rate ? nlohmann::json(*engine.rate) : nlohmann::json();
  nlohmann::json router_rates = nlohmann::json::object(), engine_rates = nlohmann::json::object();
  for (const auto& [key, r] : cache.router) router_rates[key] = rate_json(r);
  for (const auto& [key, r] : cache.engine) engine_rates[key] = rate_json(r);
  o["router_cache"] = std::move(router_rates);
  o["engine_cache"] = std::move(engine_rates);
  o["scrape_errors"] = cache.scrape_errors;
}

}  // namespace pdr::loadgen
