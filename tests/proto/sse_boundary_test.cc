#include "proto/sse_boundary.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/support/sse_boundary_reference.h"

namespace pdr::proto {
namespace {

// Feeds `body` in pieces of `step` bytes, cutting at every boundary the scanner reports as a
// relay does; returns the pieces relayed ("|" between them), the held rest after "#".
std::string relay(std::string_view body, size_t step) {
  SseBoundaryScanner scan;
  std::string held, out;
  for (size_t at = 0; at < body.size(); at += step) {
    held.append(body.substr(at, step));
    const size_t cut = scan.scan(held);
    if (cut == 0) continue;
    out += held.substr(0, cut) + "|";
    held.erase(0, cut);
    scan.consumed(cut);
  }
  return out + "#" + held;
}

TEST(SseBoundary, AllThreeTerminatorsEndAnEvent) {
  for (size_t step : {1, 2, 3, 100}) {
    SCOPED_TRACE(step);
    EXPECT_EQ(relay("data: a\n\ndata: b", step), "data: a\n\n|#data: b");
    EXPECT_EQ(relay("data: a\r\n\r\ndata: b", step), "data: a\r\n\r\n|#data: b");
    EXPECT_EQ(relay("data: a\r\rdata: b", step), "data: a\r\r|#data: b");
    EXPECT_EQ(relay("data: a\n\r\ndata: b\r\n\n", step).back(), '#');
    EXPECT_EQ(relay("data: a\ndata: b\n", step), "#data: a\ndata: b\n");
  }
}

TEST(SseBoundary, ACarriageReturnAtTheEndWaitsForTheNextByte) {
  SseBoundaryScanner scan;
  std::string held = "data: a\r\n\r";
  EXPECT_EQ(scan.scan(held), 0u);  // "\r" may be "\r\n"
  held += "\n";
  EXPECT_EQ(scan.scan(held), held.size());
}

TEST(SseBoundary, ManyEventsInOneChunkCutAfterTheLast) {
  SseBoundaryScanner scan;
  const std::string held = "data: 1\n\ndata: 2\r\n\r\ndata: 3\r\rdata: part";
  EXPECT_EQ(scan.scan(held), held.find("data: part"));
}

// The scanner jumps over line text 8 bytes at a time: a line ending at any offset of a word, in
// any chunking, must give the same cuts as a byte-by-byte reading of the rule.
TEST(SseBoundary, LineEndingsAtEveryOffsetMatchTheByteRule) {
  for (const char* ending : {"\n\n", "\r\r", "\r\n\r\n", "\n\r\n"}) {
    for (size_t len = 0; len < 24; ++len) {
      const std::string event = "data: " + std::string(len, 'x');
      const std::string body = event + ending + event + "\n" + event + ending + "data: tail";
      for (size_t step : {1, 3, 8, 1000}) {
        SseBoundaryScanner scan;
        std::string held;
        for (size_t at = 0; at < body.size(); at += step) {
          held.append(body.substr(at, step));
          EXPECT_EQ(scan.scan(held), test::sse_boundary_reference(held)) << len << " " << step;
        }
      }
    }
  }
}

TEST(SseBoundary, DataFieldDetection) {
  EXPECT_TRUE(sse_has_data_field("data: x\n\n"));
  EXPECT_TRUE(sse_has_data_field(": ping\r\n\r\ndata:x\r\n\r\n"));
  EXPECT_TRUE(sse_has_data_field("data\n\n"));
  EXPECT_FALSE(sse_has_data_field(": ping\n\n"));
  EXPECT_FALSE(sse_has_data_field("id: 1\n\n"));
  EXPECT_FALSE(sse_has_data_field("database: 1\n\n"));
}

}  // namespace
}  // namespace pdr::proto
