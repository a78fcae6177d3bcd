// The load a vLLM node reports of itself, read from its Prometheus page (GET /metrics): the
// gauges vllm:num_requests_running, vllm:num_requests_waiting and vllm:kv_cache_usage_perc (older
// vLLM: vllm:gpu_cache_usage_perc), as vLLM's metrics logger writes them (vllm/v1/metrics/
// loggers.py: labels model_name and, one sample per DP engine, engine="<index>"). Pure: no I/O,
// no clocks; fuzzed by tests/fuzz/engine_load_page_fuzz.cc.
//
// Lines are read with proto/prometheus_merge.h's parse_prom_sample (the same syntax and limits as
// GET /engine_metrics); other families, HELP/TYPE and comment lines are skipped. For each of the
// three families:
//  - samples of every model_name are added up (a node normally serves one model);
//  - a sample with an `engine` label that is a decimal index below max_ranks is that DP rank's;
//    one without an engine label, or with another engine value, counts towards the node only;
//  - a value that is not finite, negative, or (counts) above kMaxCount, or (KV usage) above 1
//    makes the page malformed: it is not a load figure.
// Node figures: running and waiting are the sums over samples; KV usage is the mean over the
// samples (DP engines have equal KV pools, so the mean is the node's share in use).
//
// Outcome: kOk when both request families have at least one sample (KV usage may be absent:
// kv_cache_usage < 0); kMalformed when a family sample is unusable or the page has no
// well-formed sample line but some other non-comment line (garbage); kMissingFamilies when the
// page is readable but lacks running or waiting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "proto/prometheus_merge.h"

namespace pdr::proto {

struct EngineLoadFigures {
  uint32_t running = 0;          // requests in the engine's running batch
  uint32_t waiting = 0;          // requests queued (vLLM counts those waiting for remote KV too)
  double kv_cache_usage = -1;    // 0..1; negative: not reported
  friend bool operator==(const EngineLoadFigures&, const EngineLoadFigures&) = default;
};

struct EngineLoadPage {
  enum class Outcome : uint8_t { kOk, kMalformed, kMissingFamilies };
  static constexpr double kMaxCount = 1e7;

  Outcome outcome = Outcome::kMissingFamilies;
  EngineLoadFigures node;
  // Per DP rank, index = the engine label, up to the highest engine seen (a rank in between that
  // had no sample keeps zeros and kv_cache_usage < 0). Empty when no sample had an engine label.
  std::vector<EngineLoadFigures> ranks;
};

struct EngineLoadPageLimits {
  PromMergeLimits lines;       // per-line limits (max_lines: lines read at most)
  uint32_t max_ranks = 1024;   // engine labels at or above: counted for the node only
};

EngineLoadPage read_engine_load_page(std::string_view page, const EngineLoadPageLimits& limits = {});

std::string_view to_string(EngineLoadPage::Outcome);  // "ok", "malformed", "missing_families"

}  // namespace pdr::proto
