// SimEngine: runs the simulated vLLM engines of `pdnode sim --engine vllm` (one EngineScheduler per
// DP rank, node/sim/engine/scheduler.h) in wall-clock time, on a thread of its own, and
// connects them to the server's requests.
//
// Each rank steps on its own: schedule() starts a step, which ends step_ms x time_scale later
// (node/sim/engine/profile.h); at its end the step's tokens come out, the KV events it
// caused are published (one batch per step, as vLLM's engine core publishes them) and the next
// step starts at once if there is work, at the previous step's modelled end (a wake-up that comes
// late does not slow the engine down, up to kMaxLag behind the clock). A rank with no work sleeps
// until a request arrives or a remote KV load ends: the thread blocks in epoll on an eventfd
// (commands) and a timerfd (the next step end or modelled transfer completion, to the
// nanosecond); nothing polls.
//
// P/D decode (EngineRequestSpec::remote_tokens > 0): when its rank gives it blocks, the engine
// starts the modelled transfer of the KV its cache lacks (node/sim/engine/kv_transfer_model.h,
// one model per node shared by all ranks) and tells the server to start the real pull
// (EngineNotice::kLoadRemote); the load is over when both have ended (remote_kv_ready() says
// how the real one went). A failed real pull makes the engine recompute the prompt; the server
// fails a decode leg's request itself (and cancel()s it).
//
// Notices to the server (tokens, admissions, loads to start) are handed to `sink` on the engine
// thread, in one batch per wake-up; the server posts them to its workers. Metrics (vLLM's names,
// labelled model_name and engine = the DP rank) and prefix-cache stats are snapshots readable from
// any thread. The histograms are in wall-clock seconds, as a client sees them (divide by the time
// scale for modelled seconds).
//
// Threads: start()/stop() from the owning thread; submit(), cancel(), remote_kv_ready(),
// reset_prefix_cache(), metrics_text() and prefix_cache_json() from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/base/status.h"
#include "node/sim/engine/scheduler.h"

namespace pdr::node::sim {

struct SimEngineOptions {
  EngineProfile profile;
  double time_scale = 1.0;  // wall-clock seconds per modelled second, > 0
  uint32_t ranks = 1;
  std::string model = "sim-model";  // the model_name label
};

// One request handed to the engine. `spec.id` is ignored: the engine uses `key`.
struct EngineArrival {
  uint64_t key = 0;    // the caller's id for the request, unique among those in the engine
  uint32_t route = 0;  // opaque to the engine, returned in each notice (the owning worker)
  uint32_t rank = 0;   // DP rank; out of range: rank 0
  EngineRequestSpec spec;
  std::chrono::steady_clock::time_point arrival;  // for TTFT, queue time and e2e latency
};

struct EngineNotice {
  enum class Kind : uint8_t {
    kAdmitted,    // scheduled for the first time: cached_tokens / queried_tokens of its lookup
    kLoadRemote,  // got blocks for its remote KV: start the real pull, then remote_kv_ready()
    kToken,       // output `index` came out; `finished` after the last one
  };
  Kind kind = Kind::kToken;
  uint64_t key = 0;
  uint32_t route = 0;
  uint32_t index = 0;
  bool finished = false;
  uint32_t cached_tokens = 0;
  uint32_t queried_tokens = 0;
};

// KV events of one rank: a batch of changes, or (changes empty) AllBlocksCleared.
using EngineEventsSink = std::function<void(uint32_t rank, std::vector<PrefixCacheChange> changes)>;
using EngineNoticeSink = std::function<void(std::vector<EngineNotice> notices)>;

class SimEngine {
 public:
  // How far a rank's modelled clock may trail the wall clock before it skips ahead (a stalled
  // machine then loses that time, as a slow GPU would, instead of bursting steps out).
  static constexpr std::chrono::milliseconds kMaxLag{50};

  SimEngine(SimEngineOptions options, EngineNoticeSink notices, EngineEventsSink events);
  ~SimEngine();  // stop()
  SimEngine(const SimEngine&) = delete;
  SimEngine& operator=(const SimEngine&) = delete;

  Status start();
  void stop();  // idempotent; requests still in the engine are dropped without notices

  void submit(EngineArrival arrival);
  // The request is gone (client closed, failed, answered), or a finished request that holds its
  // blocks (EngineRequestSpec::hold_blocks_after_finish: a P/D prefill's KV until the decode read
  // it) may let them go: its blocks are freed at once. Unknown keys are ignored.
  void cancel(uint64_t key);
  // The real pull of a request's remote KV (after its kLoadRemote) ended.
  void remote_kv_ready(uint64_t key, bool ok);
  // vLLM's POST /reset_prefix_cache on every rank whose cache is not in use (AllBlocksCleared).
  void reset_prefix_cache();

  // vLLM's Prometheus families for every rank (node/sim/server.h's GET /metrics).
  std::string metrics_text() const;
  // {"engine":"vllm","block_tokens":N,"capacity_blocks":N,"ranks":[{...}, ...]} for GET
  // /sim/prefix_cache.
  nlohmann::json prefix_cache_json() const;
  const SimEngineOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pdr::node::sim
