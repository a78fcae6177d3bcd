// The load a node reports of itself (its vLLM /metrics page, proto/engine_load_page.h), as
// pdrouter's periodic scrape last read it (router/proxy/engine_load_scrape.h, topology
// load_signals), kept with its time in the node's liveness cell (instance.h:
// InstanceLiveness::engine_load) beside the load ledger, and what a routing policy should read
// of the two together (merge_load).
//
// Ledger and engine figures see different things. The ledger (load_ledger.h) is exact and
// current, but counts only what this pdrouter put on the node. The engine's figures count every
// client's requests (another router replica, clients sent to the node directly) and the
// engine's real queue and KV use, but are as old as the last scrape. So:
//  - fresh figures (read no longer than stale_after ago, the topology's load_signals value when
//    they were stored) are `present`; older or absent ones are not, and the ledger alone is the
//    source (a node whose scrape fails, a scrape turned off, a node that never answered);
//  - merge_load adds to the ledger's current requests the requests the engine had that were not
//    pdrouter's own when the page was read (engine running + waiting, less the ledger's requests
//    at that moment, never below 0): other clients' load, which the ledger cannot see, without
//    counting pdrouter's own twice; the engine's waiting count and KV usage are passed through;
//    the token figures stay the ledger's (vLLM's page has no per-request token counts).
//
// Per DP rank: when the page had engine labels, each rank's figures are kept too (up to the
// slots made on the first store, sized by that page's ranks and at most kMaxEngineLoadRanks);
// engine_rank_load reads one.
//
// Thread-safety: one writer at a time (the scrape, on one worker loop); any thread reads,
// without a lock: a sequence counter around the stored figures lets a reader retry the rare read
// that overlapped a store (all fields are atomics, so a torn read is retried, never undefined).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>

#include "discovery/load_ledger.h"
#include "proto/engine_load_page.h"

namespace pdr::discovery {

inline constexpr uint32_t kMaxEngineLoadRanks = 1024;

// Why a scrape of a node failed (pdrouter_engine_scrape_failures_total{reason}).
enum class EngineScrapeFailure : uint8_t {
  kNone,
  kConnect,          // no connection, reset, or the call failed before an answer
  kTimeout,          // no whole answer within load_signals.timeout_ms
  kStatus,           // an answer other than 200
  kTooLarge,         // a body over load_signals.max_body_bytes
  kMalformed,        // not a Prometheus page, or an unusable figure
  kMissingFamilies,  // a page without vllm:num_requests_running / _waiting
  kCount
};
std::string_view to_string(EngineScrapeFailure);  // "connect", "timeout", "status", ...

struct EngineLoad {
  bool present = false;                   // fresh figures (the rest is meaningless when false)
  std::chrono::steady_clock::duration age{};  // since the page was read
  proto::EngineLoadFigures figures;       // the node's (or the rank's)
  // pdrouter's own requests in flight on the node (or rank) by its ledger when the page was read.
  uint32_t own_requests_at_read = 0;
  uint32_t ranks = 0;  // DP ranks the page had engine labels for (0: none); node reading only
};

// What a policy should read: the ledger's figures with the engine's folded in (see above). For a
// node: merge_load(node_load(*inst.liveness), engine_load(inst, now)); for one DP rank:
// merge_load(ledger.rank(r), engine_rank_load(inst, r, now)) (the rank's own requests were
// recorded per rank).
struct MergedLoad {
  LoadFigures ledger;             // as given
  uint32_t requests = 0;          // ledger.requests + other_requests
  uint32_t other_requests = 0;    // the engine's requests that are not pdrouter's (0: none known)
  uint32_t engine_waiting = 0;    // the engine's queue, every client's (0 when not present)
  double kv_cache_usage = -1;     // the engine's 0..1; negative: not known
  bool engine = false;            // engine figures were present and used
};
MergedLoad merge_load(const LoadFigures& ledger, const EngineLoad& engine);

// Last outcome of the scrape of one node, for /status.
struct EngineScrapeState {
  EngineScrapeFailure last_failure = EngineScrapeFailure::kNone;  // kNone: the last try read a page
  std::chrono::steady_clock::time_point last_failure_at{};        // epoch when none
  uint64_t reads = 0, failures = 0;                               // this node's
};

class EngineLoadCell {
 public:
  using Clock = std::chrono::steady_clock;
  EngineLoadCell() = default;
  ~EngineLoadCell();
  EngineLoadCell(const EngineLoadCell&) = delete;
  EngineLoadCell& operator=(const EngineLoadCell&) = delete;

  // The writer. `own` / `own_rank(i)`: pdrouter's requests in flight by the ledger at `read_at`.
  void store(const proto::EngineLoadPage& page, uint32_t own_requests, const LoadLedger& ledger,
             Clock::time_point read_at, Clock::duration stale_after);
  void fail(EngineScrapeFailure why, Clock::time_point at);

  EngineLoad node(Clock::time_point now) const;
  EngineLoad rank(uint32_t rank, Clock::time_point now) const;
  EngineScrapeState state() const;

 private:
  struct Slot {
    std::atomic<uint32_t> running{0}, waiting{0}, own{0};
    std::atomic<uint64_t> kv_bits{0};
  };
  struct Ranks {
    uint32_t count = 0;
    std::unique_ptr<Slot[]> slots;
  };
  EngineLoad read(const Slot& slot, uint32_t rank_limit, Clock::time_point now) const;

  std::atomic<uint64_t> seq_{0};  // odd while a store runs
  std::atomic<int64_t> read_at_ns_{0};
  std::atomic<int64_t> fresh_until_ns_{0};  // 0: never stored
  std::atomic<uint32_t> page_ranks_{0};
  Slot node_;
  std::atomic<Ranks*> ranks_{nullptr};  // made on the first store with engine labels, then kept
  std::atomic<uint8_t> last_failure_{0};
  std::atomic<int64_t> last_failure_ns_{0};
  std::atomic<uint64_t> reads_{0}, failures_{0};
};

struct Instance;
// The node's scraped figures when fresh at `now`, present=false otherwise.
EngineLoad engine_load(const Instance& node, std::chrono::steady_clock::time_point now);
// One DP rank's; present=false when stale, or the page had no figures for that rank.
EngineLoad engine_rank_load(const Instance& node, uint32_t rank, std::chrono::steady_clock::time_point now);

}  // namespace pdr::discovery
