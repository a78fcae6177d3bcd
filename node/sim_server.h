// SimServer: the simulated vLLM OpenAI server behind `pdnode sim` (shared/DESIGN.md, "Simulated
// vLLM node"). It answers GET /health, GET /v1/models, POST /v1/completions and
// POST /v1/chat/completions in vLLM's JSON and SSE formats, validates kv_transfer_params,
// X-Request-Id and X-data-parallel-rank like the chosen connector (sim_kv.h), and paces output:
// the first token after prefill_us_per_token x prompt tokens (a decode leg skips prefill: its KV
// comes from the prefill node), then one token per decode_us_per_token. Non-streaming responses
// are sent when the last token would have been produced. Pacing uses a uv timer on the request's
// worker loop; nothing sleeps.
//
// Closing the HTTP connection aborts the request, as in vLLM: its timer is cancelled, its state
// freed, and the abort counted.
//
// Test endpoints: GET /sim/requests returns the last 256 requests (method, path, headers with
// lower-cased names, body as a string, arrival time in unix ms, status answered (0 while pending),
// aborted flag) and counters {requests, aborts, errors_by_reason}; POST /sim/reset clears them.
// /sim/* requests are not themselves recorded.
//
// Mooncake prefill nodes also answer the bootstrap server's GET /query, on the main port and, when
// bootstrap_port is set, on a second listener of its own.
//
// Threads: start() and stop() from one owning thread (not a worker). Requests run on the
// http::Server workers; each request's state lives on its worker and is touched only there. The
// request log is shared and mutex-protected.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "node/sim_kv.h"
#include "proto/status.h"

namespace pdr::node::sim {

struct SimOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: ephemeral, see SimServer::port()
  uint32_t workers = 1;
  std::string model = "sim-model";
  uint32_t max_model_len = 8192;
  uint32_t prefill_us_per_token = 20;
  uint32_t decode_us_per_token = 1000;
  KvNodeIdentity node;                    // node.http_port is filled in by start()
  std::optional<uint16_t> bootstrap_port;  // Mooncake prefill: separate /query listener (0 ok)
};

class SimServer {
 public:
  // `mover` must be safe to call from several worker threads at once. Null: NullKvMover.
  explicit SimServer(SimOptions options, std::unique_ptr<KvMover> mover = nullptr);
  ~SimServer();  // stop() if still running
  SimServer(const SimServer&) = delete;
  SimServer& operator=(const SimServer&) = delete;

  Status start();
  uint16_t port() const;
  std::optional<uint16_t> bootstrap_port() const;  // bound port of the separate listener
  // Drops in-flight requests (their clients see truncated streams) and stops the listeners.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdr::node::sim
