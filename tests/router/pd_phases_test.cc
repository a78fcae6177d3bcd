// The per-dialect P/D phase clock (router/proxy/pd_phases.h): what each phase measures for serial
// and concurrent legs, and what is left unobserved.
#include "router/proxy/pd_phases.h"

#include <gtest/gtest.h>

#include "proto/dialects/dialect.h"
#include "router/proxy/abort_requests.h"

namespace pdr::router::proxy {
namespace {

using namespace std::chrono_literals;
using Clock = PdPhaseClock::Clock;

const proto::Dialect* dialect(std::string_view name) {
  for (const proto::Dialect* d : proto::all_dialects()) {
    if (d->name == name) return d;
  }
  return nullptr;
}

LatencyHistogram::Snapshot phase(const PdPhaseHistograms& h, std::string_view name, PdPhase p) {
  return h[proto::dialect_index(dialect(name))][static_cast<size_t>(p)].snapshot();
}

TEST(PdPhases, EveryDialectHasItsSeries) { EXPECT_LE(proto::all_dialects().size(), kMaxPdDialects); }

TEST(PdPhases, SerialHandoverIsPrefillAnswerToTheDecodesFirstByte) {
  PdPhaseHistograms h{};
  PdPhaseClock c;
  const Clock::time_point t0 = Clock::now();
  const proto::Dialect* nixl = dialect("nixl");
  c.prefill_sent(t0);
  c.prefill_answered(nixl, h, t0 + 40ms);
  c.decode_sent(t0 + 41ms);
  c.decode_bytes(nixl, true, h, t0 + 47ms);
  c.decode_bytes(nixl, true, h, t0 + 60ms);  // only the first counts
  c.decode_answered(nixl, h, t0 + 100ms);
  EXPECT_EQ(phase(h, "nixl", PdPhase::kPrefill).count, 1u);
  EXPECT_DOUBLE_EQ(phase(h, "nixl", PdPhase::kPrefill).sum_seconds, 0.040);
  EXPECT_EQ(phase(h, "nixl", PdPhase::kHandover).count, 1u);
  EXPECT_DOUBLE_EQ(phase(h, "nixl", PdPhase::kHandover).sum_seconds, 0.007);
  EXPECT_DOUBLE_EQ(phase(h, "nixl", PdPhase::kDecode).sum_seconds, 0.059);
  EXPECT_EQ(phase(h, "nixl-push", PdPhase::kPrefill).count, 0u);
}

TEST(PdPhases, ConcurrentDecodeAnsweringFirstCountsZero) {
  PdPhaseHistograms h{};
  PdPhaseClock c;
  const Clock::time_point t0 = Clock::now();
  const proto::Dialect* push = dialect("nixl-push");
  c.prefill_sent(t0);
  c.decode_sent(t0);
  c.decode_bytes(push, true, h, t0 + 30ms);
  c.prefill_answered(push, h, t0 + 35ms);
  c.decode_answered(push, h, t0 + 90ms);
  EXPECT_EQ(phase(h, "nixl-push", PdPhase::kHandover).count, 1u);
  EXPECT_EQ(phase(h, "nixl-push", PdPhase::kHandover).sum_seconds, 0.0);
  EXPECT_DOUBLE_EQ(phase(h, "nixl-push", PdPhase::kDecode).sum_seconds, 0.090);
}

TEST(PdPhases, JsonAnswersAndDecodesAloneHaveNoHandover) {
  PdPhaseHistograms h{};
  const Clock::time_point t0 = Clock::now();
  const proto::Dialect* nixl = dialect("nixl");
  PdPhaseClock json;
  json.prefill_sent(t0);
  json.prefill_answered(nixl, h, t0 + 10ms);
  json.decode_sent(t0 + 10ms);
  json.decode_bytes(nixl, false, h, t0 + 50ms);
  json.decode_answered(nixl, h, t0 + 50ms);
  EXPECT_EQ(phase(h, "nixl", PdPhase::kHandover).count, 0u);
  EXPECT_EQ(phase(h, "nixl", PdPhase::kDecode).count, 1u);
  PdPhaseClock alone;  // no prefill leg: not P/D
  alone.decode_sent(t0);
  alone.decode_bytes(nixl, true, h, t0 + 5ms);
  alone.decode_answered(nixl, h, t0 + 9ms);
  EXPECT_EQ(phase(h, "nixl", PdPhase::kDecode).count, 1u);
  EXPECT_EQ(phase(h, "nixl", PdPhase::kHandover).count, 0u);
}

TEST(PdPhases, ARetriedDecodeKeepsThePrefillsAnswerTime) {
  PdPhaseHistograms h{};
  PdPhaseClock c;
  const Clock::time_point t0 = Clock::now();
  const proto::Dialect* nixl = dialect("nixl");
  c.prefill_sent(t0);
  c.prefill_answered(nixl, h, t0 + 10ms);
  c.decode_sent(t0 + 10ms);  // fails before any byte
  c.decode_sent(t0 + 20ms);  // the same params to another decode
  c.decode_bytes(nixl, true, h, t0 + 25ms);
  c.decode_answered(nixl, h, t0 + 30ms);
  EXPECT_DOUBLE_EQ(phase(h, "nixl", PdPhase::kHandover).sum_seconds, 0.015);
  EXPECT_DOUBLE_EQ(phase(h, "nixl", PdPhase::kDecode).sum_seconds, 0.010);
}

TEST(AbortRequests, BodyNamesVllmsEngineIdForGenerate) {
  EXPECT_EQ(generate_engine_request_id("5a0e-1"), "generate-tokens-5a0e-1");
  EXPECT_EQ(abort_requests_body("5a0e-1"), R"({"request_ids":["generate-tokens-5a0e-1"]})");
  EXPECT_EQ(abort_requests_body("a\"b"), R"({"request_ids":["generate-tokens-a\"b"]})");
}

}  // namespace
}  // namespace pdr::router::proxy
