// SimServer: the simulated vLLM OpenAI server behind `pdnode sim` (docs/design/engine-model.md, "The
// simulated node"). It answers GET /health, GET /v1/models, POST /v1/completions,
// POST /v1/chat/completions and POST /v1/responses (responses.h) in vLLM's JSON and SSE formats, validates kv_transfer_params,
// X-Request-Id and X-data-parallel-rank like the chosen connector (kv.h, its dialect's file in
// node/sim/dialects/), and paces output:
// the first token after prefill_us_per_token x the prompt tokens its DP rank's prefix cache did not
// hold (cache_model.h; a decode leg skips prefill: its KV comes from the prefill node, and
// its blocks are stored once the KV arrived), then one token per decode_us_per_token. Non-streaming responses
// are sent when the last token would have been produced. Pacing uses a uv timer on the request's
// worker loop; nothing sleeps.
//
// Closing the HTTP connection aborts the request, as in vLLM: its timer is cancelled, its state
// freed, and the abort counted.
//
// Also POST /tokenize, /detokenize, /v1/embeddings, /v1/chat/completions/render and
// /v1/completions/render: deterministic fakes in vLLM's shapes (aux_api.h), answered at once;
// POST /reset_prefix_cache answers 200 with an empty body, as vLLM does. GET /metrics answers a
// small vLLM-like Prometheus page (vllm:num_requests_running and vllm:num_requests_waiting
// gauges, the latter always 0: the per-token model has no queue; vllm:request_success_total,
// vllm:prompt_tokens_total and vllm:generation_tokens_total counters, labelled model_name and
// engine="0"), enough for pdrouter's /engine_metrics and its load scrape.
//
// Test endpoints: GET /sim/requests returns the last 256 requests (method, path, headers with
// lower-cased names, body as a string, arrival time in unix ms, status answered (0 while pending),
// aborted flag) and counters {requests, aborts, errors_by_reason}; POST /sim/reset clears them.
// /sim/* requests are not themselves recorded. GET /sim/kv returns the KV mover's counters
// (KvMover::stats(): kv_blocks_held, kv_blocks_reaped, kv_transfers, kv_bytes_moved,
// kv_mismatches, kv_errors, the engine's counters, ...).
//
// KV: a finished prefill leg exports its blocks (KvMover::export_prefill_blocks; their ids become
// remote_block_ids); a decode leg starts importing its KV on arrival and emits its first token (or,
// non-streaming, starts its pacing) only once the import succeeded; a failed import fails the
// request (non-stream: the error status and vLLM's body; stream: the head was sent, so an
// {"error": ...} event, then [DONE]). The decode's blocks are freed when the leg ends, however.
//
// Prefix cache: each generation request's entry in /sim/requests has "cached_tokens", and its
// counters the prefix_cache_* totals. GET /sim/prefix_cache returns SimCacheModel::stats_json();
// POST /sim/prefix_cache {"withhold_batches": N} (test only) makes the KV events publisher keep
// its next N batches from subscribers (they stay replayable: a gap); POST /reset_prefix_cache
// (vLLM's) empties the caches and publishes AllBlocksCleared.
//
// Fault injection (test only; faults.h): POST /sim/faults with a JSON object queues a fault,
// DELETE /sim/faults clears the queue, GET /sim/faults lists it (each answers {"faults":[...]};
// a bad body is a 400 in vLLM's error format). Keys: exactly one of
//   "status": 400..599        answer with that status and vLLM's error body
//   "hang": true              never answer; the client's close is counted as an abort
//   "close_after_tokens": N   stream: N token events, then the connection is cut (no terminating
//                             chunk; a generation of <= N tokens completes normally);
//                             non-stream: the connection is closed unanswered when the answer
//                             would have been sent (the generation paths, /v1/responses
//                             included; any other path is closed unanswered at once)
//   "close_immediately": true close the connection, unanswered, as soon as the request arrives
//   "stop_after_first_token": true   one token, then finish_reason "stop" (an EOS); a prefill
//                             leg exports no KV and answers kv_transfer_params null, as vLLM
// and/or "delay_ms": 0..600000 (wait that long, on a timer, before any of the above or before
// handling the request normally; a client close during the wait is an abort); plus "count" (how
// many matching requests it applies to, default 1, -1 until cleared) and "path" (exact request
// path; default /v1/completions and /v1/chat/completions). Unknown keys are refused. Each request
// takes the first queued fault matching its path. A faulted request is still recorded: its entry's
// "fault" field is the fault object (null otherwise), and counters.faults_applied counts them.
// A connection the sim cuts itself (close_* faults) is not counted as an abort.
//
// A prefill whose dialect runs a bootstrap server (SimDialect::bootstrap_query: Mooncake) also
// answers its GET /query, on the main port and, when bootstrap_port is set, on a second listener
// of its own (start() refuses bootstrap_port on any other node).
//
// Engine mode (options.engine set, `pdnode sim --engine vllm`): a simulated vLLM V1 engine per DP
// rank (node/sim/engine/driver.h) times every generation instead: the request joins its
// rank's scheduler, each token goes out at the end of the engine step that sampled it, a decode
// leg's KV import starts once its rank has blocks for the prompt (and ends with the modelled
// transfer time too), a prefill leg reusing the last turn's KV pulls it likewise, and a prefill
// leg's blocks stay in use after its answer until the KV mover reports the decode read them (or
// the export expired: KvMover::set_export_released). GET /metrics then
// answers the engine's vLLM families (node/sim/engine/metrics.h), GET /sim/prefix_cache the
// engine's caches, POST /reset_prefix_cache resets them, and the KV events publisher announces the
// engine's blocks. The per-token prefix caches are not used.
//
// options.time_scale (> 0) multiplies every modelled duration (per-token prefill and decode times,
// engine steps, KV transfers) into wall-clock time.
//
// Threads: start() and stop() from one owning thread (not a worker). Requests run on the
// http::Server workers; each request's state lives on its worker and is touched only there. The
// request log and the fault queue are shared and mutex-protected.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "router/http/tls_server.h"
#include "node/sim/cache_model.h"
#include "node/sim/engine/driver.h"
#include "node/sim/kv.h"
#include "proto/base/status.h"

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
  std::optional<uint16_t> bootstrap_port;  // bootstrap server: separate /query listener (0 ok)
  // The prefix caches (and KV events publisher). Null: the server makes one per DP rank with
  // SimCacheOptions' defaults and no publisher.
  std::shared_ptr<SimCacheModel> cache;
  // NIXL (vLLM's bidirectional_kv_xfer): a decode ends each answer with kv_transfer_params naming
  // the blocks of its KV pool it keeps for the conversation's next turn (the last stream chunk
  // carries them); a prefill given them (do_remote_decode + remote_block_ids) pulls those blocks
  // through the KvMover before computing, and computes only the tokens they do not cover.
  bool bidirectional_kv_xfer = false;
  // vLLM's --tokens-only: POST /abort_requests {"request_ids": [...]} is served (404 otherwise, as
  // vLLM registers it only then); each id ends the in-flight /inference/v1/generate request whose
  // engine id ("generate-tokens-" + its X-Request-Id) it names. The request log keeps the calls.
  bool tokens_only = false;
  uint32_t render_feature_bytes = 4096;    // fake feature bytes per image in a render answer
  // The simulated vLLM engine (its ranks and model come from `node` and `model`); none: per-token
  // pacing.
  std::optional<SimEngineOptions> engine;
  double time_scale = 1.0;
  // Set: the HTTP listener speaks TLS (router/http/tls_server.h), as vLLM behind --ssl-certfile.
  std::shared_ptr<const http::TlsServerContext> tls;
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
  const std::string& engine_id() const;            // the node's engine id (set by start())
  // Drops in-flight requests (their clients see truncated streams) and stops the listeners.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdr::node::sim
