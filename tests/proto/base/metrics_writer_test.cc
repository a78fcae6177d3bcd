// MetricsWriter: the Prometheus text exposition of histograms (golden text), next to a counter.
#include "proto/base/metrics_writer.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>

#include "proto/base/latency_histogram.h"

namespace pdr {
namespace {

TEST(MetricsWriter, HistogramGoldenText) {
  MetricsWriter out;
  const std::array<double, 3> bounds{0.0005, 0.25, 2.5};
  const std::array<uint64_t, 3> ok{1, 3, 4};
  const std::array<uint64_t, 3> failed{0, 0, 0};
  out.histogram("x_seconds", "Help of x", bounds, ok, 3.25, 5, {{"outcome", "done"}});
  out.histogram("x_seconds", "Help of x", bounds, failed, 0, 0, {{"outcome", "failed"}});
  out.counter("y_total", "Help of y", 2);
  EXPECT_EQ(out.text(),
            "# HELP x_seconds Help of x\n"
            "# TYPE x_seconds histogram\n"
            "x_seconds_count{outcome=\"done\"} 5\n"
            "x_seconds_sum{outcome=\"done\"} 3.25\n"
            "x_seconds_bucket{outcome=\"done\",le=\"0.0005\"} 1\n"
            "x_seconds_bucket{outcome=\"done\",le=\"0.25\"} 3\n"
            "x_seconds_bucket{outcome=\"done\",le=\"2.5\"} 4\n"
            "x_seconds_bucket{outcome=\"done\",le=\"+Inf\"} 5\n"
            "x_seconds_count{outcome=\"failed\"} 0\n"
            "x_seconds_sum{outcome=\"failed\"} 0\n"
            "x_seconds_bucket{outcome=\"failed\",le=\"0.0005\"} 0\n"
            "x_seconds_bucket{outcome=\"failed\",le=\"0.25\"} 0\n"
            "x_seconds_bucket{outcome=\"failed\",le=\"2.5\"} 0\n"
            "x_seconds_bucket{outcome=\"failed\",le=\"+Inf\"} 0\n"
            "# HELP y_total Help of y\n"
            "# TYPE y_total counter\n"
            "y_total 2\n");
}

TEST(MetricsWriter, HistogramWithoutLabels) {
  MetricsWriter out;
  const std::array<double, 1> bounds{1};
  const std::array<uint64_t, 1> counts{0};
  out.histogram("z_seconds", "Help of z", bounds, counts, 7.5, 2);
  EXPECT_EQ(out.text(),
            "# HELP z_seconds Help of z\n"
            "# TYPE z_seconds histogram\n"
            "z_seconds_count 2\n"
            "z_seconds_sum 7.5\n"
            "z_seconds_bucket{le=\"1\"} 0\n"
            "z_seconds_bucket{le=\"+Inf\"} 2\n");
}

TEST(MetricsWriter, EveryLatencyBoundIsWrittenExactly) {
  MetricsWriter out;
  LatencyHistogram h;
  const auto s = h.snapshot();
  out.histogram("l_seconds", "h", LatencyHistogram::kBoundSeconds, s.cumulative, s.sum_seconds, s.count);
  const std::string text = out.text();
  for (const char* le : {"0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1",
                         "2.5", "5", "10", "30", "60", "120", "300", "+Inf"}) {
    EXPECT_NE(text.find("l_seconds_bucket{le=\"" + std::string(le) + "\"} 0\n"), std::string::npos) << le << "\n" << text;
  }
}

}  // namespace
}  // namespace pdr
