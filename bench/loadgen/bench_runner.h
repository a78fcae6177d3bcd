// Drives a benchmark run on one libuv loop (the calling thread): sends each request at its
// arrival time (workload.h, or a trace's: trace_workload.h, whose prompts it builds when they are
// sent), to one target or, given several, to each in turn, holds a conversation's turn back until the previous turn answered
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

#include "bench/loadgen/bench_metrics.h"
#include "bench/loadgen/prefix_oracle.h"
#include "bench/loadgen/stream_request.h"
#include "bench/loadgen/workload.h"
#include "proto/address.h"
#include "router/http/upstream_client.h"

namespace pdr::loadgen {

struct ScheduleOptions {
  double request_rate = 0;  // requests/s; 0 or infinity: all at once
  double burstiness = 1.0;
  // When not empty (one per request, non-decreasing): the send times, in seconds from the start,
  // instead of the rate's arrival process (a trace's timestamps).
  std::vector<double> arrival_offsets;
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
  // How late requests went out against their arrival times: the client falling behind (a busy
  // machine, prompts too large to build in time) or --max-concurrency holding them back. TTFT
  // is measured from the send, so a late send is not in it.
  double max_send_lag_s = 0;
  double mean_send_lag_s = 0;
};

// Request i goes to targets[i % targets.size()] (targets not empty).
RunOutcome run_benchmark(const std::vector<proto::HostPort>& targets, const EndpointOptions& endpoint,
                         const std::vector<BenchRequest>& requests, const ScheduleOptions& schedule,
                         const ProgressOptions& progress);
inline RunOutcome run_benchmark(const proto::HostPort& target, const EndpointOptions& endpoint,
                                const std::vector<BenchRequest>& requests,
                                const ScheduleOptions& schedule, const ProgressOptions& progress) {
  return run_benchmark(std::vector<proto::HostPort>{target}, endpoint, requests, schedule, progress);
}

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
