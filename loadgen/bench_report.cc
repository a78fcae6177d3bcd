#include "loadgen/bench_report.h"

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

}  // namespace pdr::loadgen
