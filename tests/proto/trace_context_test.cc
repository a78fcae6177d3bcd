#include "proto/trace_context.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

constexpr const char* kValid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceContext, ParsesTheSpecExample) {
  TraceParent p;
  ASSERT_TRUE(parse_traceparent(kValid, &p));
  EXPECT_EQ(to_hex(p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(to_hex(p.parent_id), "00f067aa0ba902b7");
  EXPECT_TRUE(p.sampled());
  EXPECT_EQ(format_traceparent(p.trace_id, p.parent_id, p.flags), kValid);
}

TEST(TraceContext, UnsampledAndSurroundingSpaces) {
  TraceParent p;
  ASSERT_TRUE(parse_traceparent(" \t00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00 ", &p));
  EXPECT_FALSE(p.sampled());
}

TEST(TraceContext, RefusesWhatTheSpecRefuses) {
  TraceParent p;
  p.flags = 0x7f;  // untouched on failure
  for (const char* bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",     // short
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",   // version 00 with more
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // upper case
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // zero parent id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version ff
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // separator
           "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",    // not hex
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",   // future version, bad tail
       }) {
    EXPECT_FALSE(parse_traceparent(bad, &p)) << bad;
  }
  EXPECT_EQ(p.flags, 0x7f);
}

TEST(TraceContext, AFutureVersionIsReadForItsFirstFields) {
  TraceParent p;
  ASSERT_TRUE(parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next", &p));
  EXPECT_TRUE(p.sampled());
  ASSERT_TRUE(parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", &p));
}

TEST(TraceContext, TraceStateIsPassedOnOrDroppedWhole) {
  EXPECT_EQ(usable_tracestate(" rojo=00f067aa0ba902b7,congo=t61rcWkgMzE "), "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE");
  EXPECT_EQ(usable_tracestate(std::string(kMaxTraceState + 1, 'a')), "");
  EXPECT_EQ(usable_tracestate("a=b\r\nX-Injected: 1"), "");
  std::string many;
  for (int i = 0; i < 33; ++i) many += (i ? "," : "") + std::string("k") + std::to_string(i) + "=v";
  EXPECT_EQ(usable_tracestate(many), "");
}

}  // namespace
}  // namespace pdr::proto
