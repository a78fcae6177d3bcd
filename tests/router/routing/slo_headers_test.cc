#include "router/routing/slo_headers.h"

#include <gtest/gtest.h>

namespace pdr::router::routing {
namespace {

http::Request with_headers(std::vector<http::Header> headers) {
  http::Request r;
  r.headers = std::move(headers);
  return r;
}

TEST(SloHeaders, AcceptsWholeMillisecondsWithinBounds) {
  uint32_t v = 0;
  EXPECT_TRUE(parse_slo_value(kSloTtftHeader, "1", kMaxSloTtftMs, &v).is_ok());
  EXPECT_EQ(v, 1u);
  EXPECT_TRUE(parse_slo_value(kSloTtftHeader, "0250", kMaxSloTtftMs, &v).is_ok());
  EXPECT_EQ(v, 250u);
  EXPECT_TRUE(parse_slo_value(kSloTtftHeader, "3600000", kMaxSloTtftMs, &v).is_ok());
  EXPECT_EQ(v, 3600000u);
}

TEST(SloHeaders, RefusesAnythingElseAndKeepsTheOutput) {
  for (std::string_view bad : {"", "0", "-5", "+5", " 5", "5 ", "5.5", "1e3", "abc", "3600001", "99999999999",
                               "18446744073709551617"}) {
    uint32_t v = 7;
    const Status s = parse_slo_value(kSloTtftHeader, bad, kMaxSloTtftMs, &v);
    EXPECT_EQ(s.code(), StatusCode::kInvalidValue) << "'" << bad << "'";
    EXPECT_NE(s.message().find("x-slo-ttft-ms"), std::string::npos) << s.message();
    EXPECT_EQ(v, 7u) << bad;
  }
  uint32_t v = 0;
  EXPECT_FALSE(parse_slo_value(kSloTpotHeader, "60001", kMaxSloTpotMs, &v).is_ok());
}

TEST(SloHeaders, HeadersOverrideTheTopologyDefaults) {
  config::Topology::Policies::PredictedLatency defaults;
  defaults.slo_ttft_ms = 2000;
  defaults.slo_tpot_ms = 50;
  RequestSlo slo;
  ASSERT_TRUE(request_slo(with_headers({}), defaults, &slo).is_ok());
  EXPECT_EQ(slo.ttft_ms, 2000u);
  EXPECT_EQ(slo.tpot_ms, 50u);
  ASSERT_TRUE(request_slo(with_headers({{"X-SLO-TTFT-MS", "300"}}), defaults, &slo).is_ok());
  EXPECT_EQ(slo.ttft_ms, 300u);
  EXPECT_EQ(slo.tpot_ms, 50u);
  ASSERT_TRUE(request_slo(with_headers({{"x-slo-tpot-ms", "20"}}), {}, &slo).is_ok());
  EXPECT_EQ(slo.ttft_ms, 0u);
  EXPECT_EQ(slo.tpot_ms, 20u);
  EXPECT_TRUE(slo.any());
}

TEST(SloHeaders, ABadOrRepeatedHeaderIsAnError) {
  RequestSlo slo{1, 2};
  EXPECT_FALSE(request_slo(with_headers({{"x-slo-tpot-ms", "fast"}}), {}, &slo).is_ok());
  EXPECT_FALSE(request_slo(with_headers({{"x-slo-ttft-ms", "100"}, {"X-Slo-Ttft-Ms", "200"}}), {}, &slo).is_ok());
  EXPECT_EQ(slo.ttft_ms, 1u);  // unchanged
  EXPECT_EQ(slo.tpot_ms, 2u);
}

}  // namespace
}  // namespace pdr::router::routing
