// Service-level objectives of a run, as trace-replay studies judge a serving system:
//   TBT         per request, the mean of its slowest 10% inter-token gaps (Mooncake, FAST'25:
//               the ceil(n / 10) largest of its n gaps; 0 for a request with no gap, i.e. one
//               chunk of output)
//   met         a request that completed with TTFT <= the TTFT objective and TBT <= the TBT
//               objective (Mooncake's "effective request")
//   attainment  met / requests sent (a failed request is one that missed; DistServe's SLO
//               attainment)
//   goodput     met / run duration, in requests/s (vLLM bench's --goodput: requests/s meeting
//               every objective)
// A gap is what pdrouter-bench measures as ITL: between chunks carrying output, so a chunk of
// several tokens counts as one gap. Pure.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "bench/loadgen/bench_metrics.h"

namespace pdr::loadgen {

struct SloOptions {
  double ttft_s = 10.0;  // Mooncake's P/D study: TTFT 10 s, TBT 100 ms
  double tbt_s = 0.1;
};

// The mean of the ceil(n / 10) largest gaps; 0 when there is none.
double slowest_tenth_mean(std::vector<double> gaps);

bool meets_slo(const RequestResult& result, const SloOptions& slo);

struct SloSummary {
  SloOptions slo;
  uint32_t requests = 0;    // sent: completed + failed
  uint32_t met = 0;         // met both objectives
  uint32_t met_ttft = 0;    // completed within the TTFT objective (whatever their TBT)
  uint32_t met_tbt = 0;     // completed within the TBT objective (whatever their TTFT)
  double attainment = 0;    // met / requests; 0 without requests
  double goodput = 0;       // met / duration_s
  Distribution tbt_ms;      // over completed requests
  // HTTP status of every failed request that got an answer head other than 200 (429, 503, ...);
  // failures without one (connection lost, a stream cut short) are in BenchSummary::errors.
  std::map<int, uint32_t> failed_statuses;
};

SloSummary summarize_slo(const std::vector<RequestResult>& results, double duration_s,
                         const SloOptions& slo, const std::vector<double>& percentiles);

}  // namespace pdr::loadgen
