// EngineMetrics: what `pdnode sim --engine vllm` shows of its engines on GET /metrics, under vLLM's
// names and labels (vllm/v1/metrics/loggers.py, docs/design/metrics.md): per DP rank (label
// engine = the rank, model_name = the served model) the gauges vllm:num_requests_running,
// vllm:num_requests_waiting (requests waiting for remote KV included) and vllm:kv_cache_usage_perc
// (0..1, idle cached blocks counting as free), the counters vllm:prefix_cache_queries_total and
// vllm:prefix_cache_hits_total (tokens), vllm:num_preemptions_total, vllm:prompt_tokens_total,
// vllm:generation_tokens_total and vllm:request_success_total, and the histograms
// vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
// vllm:e2e_request_latency_seconds and vllm:request_queue_time_seconds with vLLM's buckets.
//
// Threads: the engine thread writes under update(); text() and prefix_cache_json() read a
// consistent copy from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim/engine/scheduler.h"

namespace pdr::node::sim {

// A Prometheus histogram with fixed bounds (seconds).
class EngineHistogram {
 public:
  explicit EngineHistogram(std::span<const double> bounds);
  void record(double seconds);
  const std::vector<double>& bounds() const { return bounds_; }
  std::vector<uint64_t> cumulative() const;  // per bound
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> buckets_;  // per bound, then +Inf
  uint64_t count_ = 0;
  double sum_ = 0;
};

struct EngineRankMetrics {
  EngineRankMetrics();
  EngineSchedulerStats stats;
  uint64_t cache_clears = 0;
  EngineHistogram ttft;
  EngineHistogram inter_token;
  EngineHistogram e2e;
  EngineHistogram queue;
};

class EngineMetrics {
 public:
  EngineMetrics(uint32_t ranks, std::string model);

  // Runs fn(std::vector<EngineRankMetrics>&) under the lock.
  template <typename Fn>
  void update(Fn&& fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    fn(ranks_);
  }
  std::string text() const;
  nlohmann::json prefix_cache_json(uint32_t block_size, uint32_t capacity_blocks) const;

 private:
  const std::string model_;
  mutable std::mutex mutex_;
  std::vector<EngineRankMetrics> ranks_;
};

}  // namespace pdr::node::sim
