#include "proto/sse_boundary.h"

#include <gtest/gtest.h>

#include <string>

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
