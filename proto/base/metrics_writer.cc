#include "proto/base/metrics_writer.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <map>

namespace pdr {

struct MetricsWriter::Families {
  std::vector<prometheus::MetricFamily> list;
  std::map<std::string, size_t, std::less<>> index;

  prometheus::MetricFamily& family(std::string_view name, std::string_view help, prometheus::MetricType type) {
    auto it = index.find(name);
    if (it != index.end()) return list[it->second];
    index.emplace(std::string(name), list.size());
    list.push_back(prometheus::MetricFamily{std::string(name), std::string(help), type, {}});
    return list.back();
  }
};

namespace {
prometheus::ClientMetric metric_with(const MetricsWriter::Labels& labels) {
  prometheus::ClientMetric m;
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  return m;
}
}  // namespace

MetricsWriter::MetricsWriter() : families_(new Families) {}
MetricsWriter::~MetricsWriter() { delete families_; }

void MetricsWriter::counter(std::string_view name, std::string_view help, double value, Labels labels) {
  auto m = metric_with(labels);
  m.counter.value = value;
  families_->family(name, help, prometheus::MetricType::Counter).metric.push_back(std::move(m));
}

void MetricsWriter::gauge(std::string_view name, std::string_view help, double value, Labels labels) {
  auto m = metric_with(labels);
  m.gauge.value = value;
  families_->family(name, help, prometheus::MetricType::Gauge).metric.push_back(std::move(m));
}

void MetricsWriter::histogram(std::string_view name, std::string_view help, std::span<const double> bounds,
                              std::span<const uint64_t> cumulative, double sum, uint64_t count, Labels labels) {
  auto m = metric_with(labels);
  const size_t n = std::min(bounds.size(), cumulative.size());
  m.histogram.bucket.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    prometheus::ClientMetric::Bucket b;
    b.upper_bound = bounds[i];
    b.cumulative_count = cumulative[i];
    m.histogram.bucket.push_back(b);
  }
  // The serializer adds the +Inf bucket with sample_count.
  m.histogram.sample_count = count;
  m.histogram.sample_sum = sum;
  families_->family(name, help, prometheus::MetricType::Histogram).metric.push_back(std::move(m));
}

std::string MetricsWriter::text() const { return prometheus::TextSerializer().Serialize(families_->list); }

}  // namespace pdr
