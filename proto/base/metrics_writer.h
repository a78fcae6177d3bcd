// Prometheus text exposition of counters, gauges and histograms: each module keeps its own atomics and appends them
// here when /metrics is rendered (rendered by prometheus-cpp's TextSerializer). The families that
// name pdrouter's counters live with their modules (router/metrics_page.h,
// router/proxy/proxy_counters.h, router/admin_metrics.h); this is only the writer they share.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pdr {

// Accumulates metric families in declaration order, then serialises them. A family named twice
// gets both samples (labels tell them apart).
class MetricsWriter {
 public:
  MetricsWriter();
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  using Labels = std::vector<std::pair<std::string, std::string>>;
  void counter(std::string_view name, std::string_view help, double value, Labels labels = {});
  void gauge(std::string_view name, std::string_view help, double value, Labels labels = {});
  // One histogram series: `bounds` are the finite `le` upper bounds in increasing order,
  // `cumulative[i]` the observations <= bounds[i] (same size as bounds), `count` all of them
  // (written as the `+Inf` bucket and _count), `sum` their total. Rendered as _bucket samples
  // with `le` after `labels`, then _sum and _count; # HELP/# TYPE once per family.
  void histogram(std::string_view name, std::string_view help, std::span<const double> bounds,
                 std::span<const uint64_t> cumulative, double sum, uint64_t count, Labels labels = {});
  std::string text() const;

 private:
  struct Families;
  Families* families_;
};

}  // namespace pdr
