#include "bench/loadgen/bench_metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pdr::loadgen {
namespace {

// numpy.percentile's default ("linear"): rank p/100 * (n - 1) between order statistics.
double percentile_of_sorted(const std::vector<double>& sorted, double p) {
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const auto low = static_cast<size_t>(std::floor(rank));
  const size_t high = std::min(low + 1, sorted.size() - 1);
  return sorted[low] + (sorted[high] - sorted[low]) * (rank - static_cast<double>(low));
}

}  // namespace

Distribution distribution_of(std::vector<double> values, const std::vector<double>& percentiles) {
  Distribution out;
  for (double p : percentiles) out.percentiles.emplace_back(p, 0.0);
  if (values.empty()) return out;
  std::sort(values.begin(), values.end());
  const double n = static_cast<double>(values.size());
  out.mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
  double squares = 0;
  for (double v : values) squares += (v - out.mean) * (v - out.mean);
  out.stddev = std::sqrt(squares / n);  // population, as numpy.std
  out.median = percentile_of_sorted(values, 50);
  for (auto& [p, value] : out.percentiles) value = percentile_of_sorted(values, p);
  return out;
}

BenchSummary summarize(const std::vector<RequestResult>& results, double duration_s,
                       const std::vector<double>& percentiles, uint32_t max_concurrency_observed) {
  BenchSummary summary;
  summary.duration_s = duration_s;
  summary.max_concurrency_observed = max_concurrency_observed;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestResult& r : results) {
    if (!r.success) {
      ++summary.failed;
      ++summary.errors[r.error];
      continue;
    }
    ++summary.completed;
    summary.total_input_tokens += r.input_len;
    summary.total_output_tokens += r.output_tokens;
    ttft.push_back(r.ttft_s * 1e3);
    e2el.push_back(r.latency_s * 1e3);
    if (r.output_tokens > 1) {
      tpot.push_back((r.latency_s - r.ttft_s) * 1e3 / static_cast<double>(r.output_tokens - 1));
    }
    for (double gap : r.itl_s) itl.push_back(gap * 1e3);
  }
  if (duration_s > 0) {
    summary.request_throughput = summary.completed / duration_s;
    summary.output_throughput = static_cast<double>(summary.total_output_tokens) / duration_s;
    summary.total_token_throughput =
        static_cast<double>(summary.total_input_tokens + summary.total_output_tokens) / duration_s;
  }
  summary.ttft_ms = distribution_of(std::move(ttft), percentiles);
  summary.tpot_ms = distribution_of(std::move(tpot), percentiles);
  summary.itl_ms = distribution_of(std::move(itl), percentiles);
  summary.e2el_ms = distribution_of(std::move(e2el), percentiles);
  return summary;
}

}  // namespace pdr::loadgen
