// Per-dialect P/D phase times; contract in pd_phases.h.
#include "router/proxy/pd_phases.h"

#include <string>

#include "proto/base/metrics_writer.h"
#include "proto/dialects/dialect.h"

namespace pdr::router::proxy {
namespace {

LatencyHistogram* slot(const proto::Dialect* dialect, PdPhaseHistograms& out, PdPhase phase) {
  const size_t i = proto::dialect_index(dialect);
  if (i >= out.size()) return nullptr;
  return &out[i][static_cast<size_t>(phase)];
}

}  // namespace

void PdPhaseClock::prefill_sent(Clock::time_point at) {
  *this = PdPhaseClock();
  prefill_sent_ = at;
  prefill_open_ = true;
}

void PdPhaseClock::decode_sent(Clock::time_point at) {
  decode_sent_ = at;
  decode_open_ = prefill_open_ || prefill_done_set_;  // a decode alone is not P/D
  first_byte_seen_ = false;
  handover_recorded_ = false;
}

void PdPhaseClock::prefill_answered(const proto::Dialect* dialect, PdPhaseHistograms& out, Clock::time_point at) {
  if (!prefill_open_) return;
  prefill_open_ = false;
  prefill_done_ = at;
  prefill_done_set_ = true;
  if (LatencyHistogram* h = slot(dialect, out, PdPhase::kPrefill)) h->record(at - prefill_sent_);
  if (first_byte_seen_) record_handover(dialect, out);  // a concurrent decode answered first: 0
}

void PdPhaseClock::decode_bytes(const proto::Dialect* dialect, bool stream, PdPhaseHistograms& out,
                                Clock::time_point at) {
  if (!decode_open_ || first_byte_seen_) return;
  first_byte_seen_ = true;
  first_byte_stream_ = stream;
  first_byte_ = at;
  if (prefill_done_set_) record_handover(dialect, out);
}

void PdPhaseClock::decode_answered(const proto::Dialect* dialect, PdPhaseHistograms& out, Clock::time_point at) {
  if (!decode_open_) return;
  decode_open_ = false;
  if (LatencyHistogram* h = slot(dialect, out, PdPhase::kDecode)) h->record(at - decode_sent_);
}

void PdPhaseClock::record_handover(const proto::Dialect* dialect, PdPhaseHistograms& out) {
  if (handover_recorded_ || !first_byte_stream_) return;
  handover_recorded_ = true;
  // Negative (the decode's first byte came first) counts 0 (LatencyHistogram::record).
  if (LatencyHistogram* h = slot(dialect, out, PdPhase::kHandover)) h->record(first_byte_ - prefill_done_);
}

void write_pd_phase_metrics(MetricsWriter& out, const PdPhaseHistograms& histograms) {
  struct Family {
    PdPhase phase;
    const char* name;
    const char* help;
  };
  static constexpr Family kFamilies[] = {
      {PdPhase::kPrefill, "pdrouter_pd_prefill_seconds",
       "P/D prefill legs from sent to their 2xx answer complete, by connector dialect"},
      {PdPhase::kHandover, "pdrouter_pd_handover_seconds",
       "P/D handover: the prefill's 2xx answer complete to the decode's first body byte (streamed answers; "
       "0 when a concurrent decode answered first), by connector dialect"},
      {PdPhase::kDecode, "pdrouter_pd_decode_seconds",
       "P/D decode legs from sent to their 2xx answer complete, by connector dialect"},
  };
  const auto dialects = proto::all_dialects();
  for (const Family& f : kFamilies) {
    for (size_t i = 0; i < dialects.size() && i < histograms.size(); ++i) {
      const LatencyHistogram::Snapshot s = histograms[i][static_cast<size_t>(f.phase)].snapshot();
      out.histogram(f.name, f.help, LatencyHistogram::kBoundSeconds, s.cumulative, s.sum_seconds, s.count,
                    {{"dialect", std::string(dialects[i]->name)}});
    }
  }
}

}  // namespace pdr::router::proxy
