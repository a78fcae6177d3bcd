#include "node/sim/engine/metrics.h"

#include <algorithm>

#include "proto/base/metrics_writer.h"

namespace pdr::node::sim {
namespace {

// vLLM's buckets for each histogram (vllm/v1/metrics/loggers.py).
constexpr double kTtftBounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                  1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
constexpr double kInterTokenBounds[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                        0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
constexpr double kRequestLatencyBounds[] = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

}  // namespace

EngineHistogram::EngineHistogram(std::span<const double> bounds)
    : bounds_(bounds.begin(), bounds.end()), buckets_(bounds.size() + 1, 0) {}

void EngineHistogram::record(double seconds) {
  seconds = std::max(0.0, seconds);
  // Prometheus `le`: a value equal to a bound belongs to that bound's bucket.
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin());
  ++buckets_[i];
  ++count_;
  sum_ += seconds;
}

std::vector<uint64_t> EngineHistogram::cumulative() const {
  std::vector<uint64_t> out(bounds_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) out[i] = running += buckets_[i];
  return out;
}

EngineRankMetrics::EngineRankMetrics()
    : ttft(kTtftBounds), inter_token(kInterTokenBounds), e2e(kRequestLatencyBounds), queue(kRequestLatencyBounds) {}

EngineMetrics::EngineMetrics(uint32_t ranks, std::string model)
    : model_(std::move(model)), ranks_(std::max<uint32_t>(1, ranks)) {}

std::string EngineMetrics::text() const {
  std::vector<EngineRankMetrics> ranks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ranks = ranks_;
  }
  MetricsWriter w;
  auto labels = [&](size_t rank) {
    return MetricsWriter::Labels{{"model_name", model_}, {"engine", std::to_string(rank)}};
  };
  for (size_t r = 0; r < ranks.size(); ++r) {
    const EngineSchedulerStats& s = ranks[r].stats;
    w.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", s.running, labels(r));
    w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", s.waiting, labels(r));
    w.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", s.kv_usage, labels(r));
    w.counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
              static_cast<double>(s.prefix_queries), labels(r));
    w.counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
              static_cast<double>(s.prefix_hits), labels(r));
    w.counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.",
              static_cast<double>(s.preemptions), labels(r));
    w.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", static_cast<double>(s.prompt_tokens),
              labels(r));
    w.counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
              static_cast<double>(s.generation_tokens), labels(r));
    w.counter("vllm:request_success_total", "Count of successfully processed requests.",
              static_cast<double>(s.finished), labels(r));
    const struct {
      const char* name;
      const char* help;
      const EngineHistogram& h;
    } histograms[] = {
        {"vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ranks[r].ttft},
        {"vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ranks[r].inter_token},
        {"vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", ranks[r].e2e},
        {"vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", ranks[r].queue},
    };
    for (const auto& h : histograms) {
      const std::vector<uint64_t> cumulative = h.h.cumulative();
      w.histogram(h.name, h.help, h.h.bounds(), cumulative, h.h.sum(), h.h.count(), labels(r));
    }
  }
  return w.text();
}

nlohmann::json EngineMetrics::prefix_cache_json(uint32_t block_size, uint32_t capacity_blocks) const {
  nlohmann::json ranks = nlohmann::json::array();
  std::lock_guard<std::mutex> lock(mutex_);
  for (const EngineRankMetrics& m : ranks_) {
    const EngineSchedulerStats& s = m.stats;
    ranks.push_back({{"blocks", s.cached_blocks},
                     {"free_blocks", s.free_blocks},
                     {"kv_cache_usage", s.kv_usage},
                     {"running", s.running},
                     {"waiting", s.waiting},
                     {"held", s.held},
                     {"steps", s.steps},
                     {"preemptions", s.preemptions},
                     {"queried_tokens", s.prefix_queries},
                     {"hit_tokens", s.prefix_hits},
                     {"stored_blocks", s.stored_blocks},
                     {"evicted_blocks", s.evicted_blocks},
                     {"clears", m.cache_clears}});
  }
  return nlohmann::json{{"engine", "vllm"},
                        {"block_tokens", block_size},
                        {"capacity_blocks", capacity_blocks},
                        {"ranks", std::move(ranks)}};
}

}  // namespace pdr::node::sim
