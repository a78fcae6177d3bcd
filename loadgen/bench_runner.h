// Drives a benchmark run on one libuv loop (the calling thread): sends each request at its
// arrival time (workload.h), holds a conversation's turn back until the previous turn answered
// and then composes its prompt from that answer (cache_workloads.h), holds it back while
// --max-concurrency requests are in flight, counts the prompt tokens an oracle prefix cache
// would hold (prefix_oracle.h),
// streams every answer through a StreamMeasurement, reports progress, and stops early, cancelling
// what is in flight, on SIGINT/SIGTERM. HTTP through pdrouter's own upstream client (keep-alive
// pool, llhttp), so the client side costs what pdrouter's does.
#pragma once

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/bench_metrics.h"
#include "loadgen/prefix_oracle.h"
#include "loadgen/stream_request.h"
#include "loadgen/workload.h"
#include "proto/address.h"
#include "http/upstream_client.h"

namespace pdr::loadgen {

struct ScheduleOptions {
  double request_rate = 0;  // requests/s; 0 or infinity: all at once
  double burstiness = 1.0;
  uint64_t seed = 0;
  std::optional<uint32_t> max_concurrency;
  http::UpstreamTimeouts timeouts;
  // How multi-turn prompts are composed (compose_turn) and counted by the oracle.
  PromptFormat format = PromptFormat::kWords;
  uint32_t vocab_size = 32000;
  uint32_t oracle_block_tokens = 16;
};

struct ProgressOptions {
  std::FILE* out = nullptr;  // nullptr: no progress
  std::chrono::milliseconds interval{1000};
  bool overwrite = false;  // a terminal: rewrite one line instead of printing one per interval
};

struct RunOutcome {
  std::vector<RequestResult> results;  // in request order; unsent ones (interrupted) are absent
  double duration_s = 0;               // first send -> last answer
  uint32_t max_in_flight = 0;
  bool interrupted = false;
  // Prompt tokens sent, and those an oracle prefix cache held (PrefixOracle), in send order.
  uint64_t oracle_prompt_tokens = 0;
  uint64_t oracle_hit_tokens = 0;
};

RunOutcome run_benchmark(const proto::HostPort& target, const EndpointOptions& endpoint,
                         const std::vector<BenchRequest>& requests, const ScheduleOptions& schedule,
                         const ProgressOptions& progress);

// One plain request (GET /v1/models, vLLM's initial test request): status and body, or why it
// failed before an answer.
struct FetchResult {
  Status error;  // not OK: no complete answer
  int http_status = 0;
  std::string body;
};
FetchResult fetch(const proto::HostPort& target, http::UpstreamRequest request,
                  const http::UpstreamTimeouts& timeouts, size_t max_body = 1 << 20);

}  // namespace pdr::loadgen
