#include "bench/loadgen/slo_metrics.h"

#include <algorithm>
#include <functional>
#include <numeric>

namespace pdr::loadgen {

double slowest_tenth_mean(std::vector<double> gaps) {
  if (gaps.empty()) return 0.0;
  const size_t count = (gaps.size() + 9) / 10;
  std::partial_sort(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(count), gaps.end(),
                    std::greater<>());
  return std::accumulate(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(count), 0.0) /
         static_cast<double>(count);
}

bool meets_slo(const RequestResult& result, const SloOptions& slo) {
  return result.success && result.ttft_s <= slo.ttft_s &&
         slowest_tenth_mean(result.itl_s) <= slo.tbt_s;
}

SloSummary summarize_slo(const std::vector<RequestResult>& results, double duration_s,
                         const SloOptions& slo, const std::vector<double>& percentiles) {
  SloSummary summary;
  summary.slo = slo;
  std::vector<double> tbt_ms;
  for (const RequestResult& r : results) {
    ++summary.requests;
    if (!r.success) {
      if (r.http_status != 0 && r.http_status != 200) ++summary.failed_statuses[r.http_status];
      continue;
    }
    const double tbt = slowest_tenth_mean(r.itl_s);
    tbt_ms.push_back(tbt * 1e3);
    const bool ttft_ok = r.ttft_s <= slo.ttft_s;
    const bool tbt_ok = tbt <= slo.tbt_s;
    summary.met_ttft += ttft_ok ? 1 : 0;
    summary.met_tbt += tbt_ok ? 1 : 0;
    summary.met += ttft_ok && tbt_ok ? 1 : 0;
  }
  if (summary.requests > 0) {
    summary.attainment = static_cast<double>(summary.met) / summary.requests;
  }
  if (duration_s > 0) summary.goodput = summary.met / duration_s;
  summary.tbt_ms = distribution_of(std::move(tbt_ms), percentiles);
  return summary;
}

}  // namespace pdr::loadgen
