#include "base/metrics_writer.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

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

std::string MetricsWriter::text() const { return prometheus::TextSerializer().Serialize(families_->list); }

}  // namespace pdr
