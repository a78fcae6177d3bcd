// What one benchmark request measured, and the summary over a run, with vLLM's definitions
// (`vllm bench serve`), so numbers from pdrouter-bench and vLLM's tool compare directly:
//   TTFT  request sent -> first chunk carrying generated text
//   ITL   gap between consecutive chunks carrying text (every gap of every request)
//   TPOT  per request: (latency - TTFT) / (output tokens - 1), requests with > 1 token only
//   E2EL  request sent -> last byte of the response
// Percentiles interpolate linearly between order statistics (numpy's default). Pure.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace pdr::loadgen {

struct RequestResult {
  bool success = false;
  std::string error;           // why it failed: "HTTP 503: ...", "stream ended without [DONE]", ...
  int http_status = 0;         // 0: no response head
  uint32_t input_len = 0;      // usage.prompt_tokens when the server sent it, else as generated
  uint32_t output_tokens = 0;  // usage.completion_tokens when sent, else chunks with text
  double start_s = 0;          // since the run started
  double ttft_s = 0;
  double latency_s = 0;
  std::vector<double> itl_s;
};

struct Distribution {
  double mean = 0, median = 0, stddev = 0;
  std::vector<std::pair<double, double>> percentiles;  // (p, value), in the order asked
};

// Order statistics of `values` (in any order; sorted internally). All zero when empty.
Distribution distribution_of(std::vector<double> values, const std::vector<double>& percentiles);

struct BenchSummary {
  uint32_t completed = 0;
  uint32_t failed = 0;
  double duration_s = 0;
  uint64_t total_input_tokens = 0;   // successful requests only, as vLLM counts
  uint64_t total_output_tokens = 0;
  double request_throughput = 0;     // completed / duration
  double output_throughput = 0;      // output tokens / duration
  double total_token_throughput = 0; // (input + output tokens) / duration
  uint32_t max_concurrency_observed = 0;
  // In milliseconds, over successful requests.
  Distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::map<std::string, uint32_t> errors;  // failure message -> count
};

BenchSummary summarize(const std::vector<RequestResult>& results, double duration_s,
                       const std::vector<double>& percentiles, uint32_t max_concurrency_observed);

}  // namespace pdr::loadgen
