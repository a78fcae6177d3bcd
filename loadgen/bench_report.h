// pdrouter-bench's output: the human table (the layout of `vllm bench serve`, plus failures and
// their reasons) and the JSON result (vLLM's keys, plus pdrouter-bench's own: "failed" reasons
// counted in "error_counts", the observed concurrency, the target). Pure.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "loadgen/bench_metrics.h"

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

}  // namespace pdr::loadgen
