// The P/D handover, measured: per connector dialect, how long the prefill leg takes, how long the
// decode takes to answer once the prefill is done (the handover), and how long the decode leg
// takes, as /metrics histograms (proto/base/latency_histogram.h):
//
//   pdrouter_pd_prefill_seconds{dialect}   prefill leg sent -> its 2xx answer complete
//   pdrouter_pd_handover_seconds{dialect}  prefill answer complete -> the decode's first body byte
//   pdrouter_pd_decode_seconds{dialect}    decode leg sent -> its 2xx answer complete
//
// The handover is what disaggregation adds to the time to first token: for serial dialects
// (NIXL, MoRIIO READ, P2P-NCCL) it holds the router sending the decode, the decode's scheduling,
// its KV pull and its first token; for concurrent ones (MoRIIO WRITE, Mooncake, SGLang, NIXL
// push) the decode was sent with the prefill and the prefill's answer marks the end of its
// compute, after which its KV is pushed, so the handover is the push plus the decode's first
// token; a decode whose first byte came before the prefill's answer counts 0. It is observed
// only on event-stream answers (a JSON answer's first byte comes with its last one) and only
// when both legs of the same attempt answered 2xx; a decode retried alone keeps its prefill's
// answer time. Decodes sent alone (no prefill: router/routing/decode_alone.h) are not observed at all.
//
// Worker thread only (one PdPhaseClock per request); the histograms are shared (relaxed atomics).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "proto/base/latency_histogram.h"

namespace pdr {
class MetricsWriter;
}
namespace pdr::proto {
struct Dialect;
}

namespace pdr::router::proxy {

enum class PdPhase : uint8_t { kPrefill, kHandover, kDecode };
inline constexpr size_t kPdPhaseCount = 3;
// At least proto::all_dialects().size(); a dialect past it is not observed (a test checks).
inline constexpr size_t kMaxPdDialects = 8;
using PdPhaseHistograms = std::array<std::array<LatencyHistogram, kPdPhaseCount>, kMaxPdDialects>;

class PdPhaseClock {
 public:
  using Clock = std::chrono::steady_clock;

  // A new attempt's prefill leg went out (forgets the last attempt's times).
  void prefill_sent(Clock::time_point at);
  // A decode leg went out (a decode retried alone keeps the prefill's times).
  void decode_sent(Clock::time_point at);
  // The prefill answered 2xx, complete.
  void prefill_answered(const proto::Dialect* dialect, PdPhaseHistograms& out, Clock::time_point at);
  // A 2xx decode answer's body bytes arrived (`stream`: an event stream); only the first counts.
  void decode_bytes(const proto::Dialect* dialect, bool stream, PdPhaseHistograms& out, Clock::time_point at);
  // The decode answered 2xx, complete.
  void decode_answered(const proto::Dialect* dialect, PdPhaseHistograms& out, Clock::time_point at);

 private:
  void record_handover(const proto::Dialect* dialect, PdPhaseHistograms& out);

  Clock::time_point prefill_sent_{}, prefill_done_{}, decode_sent_{}, first_byte_{};
  bool prefill_open_ = false;   // prefill_sent_ is this attempt's, not yet answered
  bool prefill_done_set_ = false;
  bool decode_open_ = false;    // decode_sent_ is this decode's, not yet answered
  bool first_byte_seen_ = false;
  bool first_byte_stream_ = false;
  bool handover_recorded_ = false;
};

// The three families, one series per dialect of proto::all_dialects().
void write_pd_phase_metrics(MetricsWriter& out, const PdPhaseHistograms& histograms);

}  // namespace pdr::router::proxy
