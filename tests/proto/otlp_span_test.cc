// The OTLP/JSON encoding, checked by decoding what it writes (nlohmann::json) as a collector does.
#include "proto/otlp_span.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace pdr::proto {
namespace {

Span sample_span() {
  Span s;
  TraceParent p;
  EXPECT_TRUE(parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", &p));
  s.trace_id = p.trace_id;
  s.span_id = {1, 2, 3, 4, 5, 6, 7, 8};
  s.parent_span_id = p.parent_id;
  s.trace_state = "vendor=x";
  s.name = "POST /v1/completions";
  s.kind = Span::Kind::kServer;
  s.start_unix_ns = 1700000000123456789ull;
  s.end_unix_ns = 1700000000223456789ull;
  s.attributes = {SpanAttribute::str("url.path", "/v1/completions"),
                  SpanAttribute::integer("http.response.status_code", 503),
                  SpanAttribute::real("ratio", 0.25), SpanAttribute::boolean("flag", true),
                  SpanAttribute::str("odd", std::string("quote\" back\\ nl\n nul") + '\0' + "\xff\xfe end")};
  s.status = Span::StatusCode::kError;
  s.status_message = "prefill_failed";
  return s;
}

TEST(OtlpSpan, EncodesWhatACollectorDecodes) {
  SpanSource source{"pdrouter-test", "1.2.3", "pdrouter", "1.2.3"};
  Span root = sample_span();
  root.parent_span_id = {};
  std::string body;
  encode_otlp_json(source, {sample_span(), root}, &body);
  const auto doc = nlohmann::json::parse(body);  // throws on invalid JSON (or invalid UTF-8)
  const auto& rs = doc.at("resourceSpans").at(0);
  EXPECT_EQ(rs.at("resource").at("attributes").at(0).at("key"), "service.name");
  EXPECT_EQ(rs.at("resource").at("attributes").at(0).at("value").at("stringValue"), "pdrouter-test");
  const auto& scope = rs.at("scopeSpans").at(0);
  EXPECT_EQ(scope.at("scope").at("name"), "pdrouter");
  const auto& spans = scope.at("spans");
  ASSERT_EQ(spans.size(), 2u);
  const auto& s = spans.at(0);
  EXPECT_EQ(s.at("traceId"), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(s.at("spanId"), "0102030405060708");
  EXPECT_EQ(s.at("parentSpanId"), "00f067aa0ba902b7");
  EXPECT_EQ(s.at("traceState"), "vendor=x");
  EXPECT_EQ(s.at("kind"), 2);
  EXPECT_EQ(s.at("startTimeUnixNano"), "1700000000123456789");  // 64-bit integers as strings
  EXPECT_EQ(s.at("endTimeUnixNano"), "1700000000223456789");
  EXPECT_EQ(s.at("status").at("code"), 2);
  EXPECT_EQ(s.at("status").at("message"), "prefill_failed");
  const auto& a = s.at("attributes");
  EXPECT_EQ(a.at(1).at("value").at("intValue"), "503");
  EXPECT_DOUBLE_EQ(a.at(2).at("value").at("doubleValue").get<double>(), 0.25);
  EXPECT_EQ(a.at(3).at("value").at("boolValue"), true);
  EXPECT_EQ(a.at(4).at("value").at("stringValue"),
            std::string("quote\" back\\ nl\n nul") + '\0' + "\xef\xbf\xbd\xef\xbf\xbd end");
  EXPECT_FALSE(spans.at(1).contains("parentSpanId"));  // a root span
}

TEST(OtlpSpan, JsonStringsAreValidUtf8WhateverTheInput) {
  std::string out;
  append_json_string("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80", &out);
  const auto decoded = nlohmann::json::parse(out).get<std::string>();
  EXPECT_EQ(decoded, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd\xef"
                     "\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
}

}  // namespace
}  // namespace pdr::proto
