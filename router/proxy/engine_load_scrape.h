// The periodic load scrape (topology load_signals.scrape_engine_metrics): every interval, a GET
// /metrics to each routable node that has no read in flight (fetch: node_metrics_fetch.h), the
// page read by proto/engine_load_page.h and its figures stored in the node's liveness cell
// (discovery/engine_load.h: EngineLoadCell::store, with the ledger's requests at that moment and
// the topology's stale_after), where routing reads them through discovery::engine_load().
//
// A read that is not whole within load_signals.timeout_ms (cancelled then), over max_body_bytes
// (abandoned at once), answered other than 200, or whose page is garbage or lacks the request
// families stores nothing: it is counted by reason (pdrouter_engine_scrape_failures_total) and
// recorded in the cell for /status; the figures already there age out after stale_after.
//
// The loop: one HTTP worker's (worker 0 of the client listener; ProxyService starts it), so it
// shares that worker's upstream pool and TLS contexts and needs no thread of its own: a read is a
// few hundred microseconds of that loop per node per interval. The topology is read at every
// tick, so a reload turns the scrape on or off and changes its figures; turned off, no read starts
// (those in flight end).
//
// Worker thread only; destroyed on it before the worker's context (its calls are cancelled).
#pragma once

#include <atomic>
#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>

#include "discovery/engine_load.h"
#include "discovery/instance.h"
#include "router/http/upstream_client.h"
#include "router/routing/session_timer.h"

namespace pdr {
class MetricsWriter;
}

namespace pdr::router::proxy {

class WorkerContext;

struct EngineScrapeCounters {
  std::atomic<uint64_t> reads{0};  // pages read and stored
  std::array<std::atomic<uint64_t>, static_cast<size_t>(discovery::EngineScrapeFailure::kCount)> failures{};
};
EngineScrapeCounters& engine_scrape_counters();  // one per process

class EngineLoadScrape {
 public:
  explicit EngineLoadScrape(WorkerContext& worker);
  ~EngineLoadScrape();
  EngineLoadScrape(const EngineLoadScrape&) = delete;
  EngineLoadScrape& operator=(const EngineLoadScrape&) = delete;

  // Arms the first tick (at once). Call once.
  void start();

  size_t in_flight() const { return reads_.size(); }

 private:
  struct Read {
    std::shared_ptr<discovery::InstanceLiveness> cell;
    std::shared_ptr<http::UpstreamCall> call;
    routing::SessionTimer deadline;
  };
  void tick();
  void begin(const std::shared_ptr<const discovery::Instance>& node);
  void failed(const discovery::InstanceLiveness* key, discovery::EngineScrapeFailure why);
  void answered(const discovery::InstanceLiveness* key, std::string&& page);

  WorkerContext& worker_;
  routing::SessionTimer tick_;
  std::unordered_map<const discovery::InstanceLiveness*, std::unique_ptr<Read>> reads_;
};

// pdrouter_engine_scrape_* (process-wide counters).
void write_engine_scrape_metrics(MetricsWriter& out);

}  // namespace pdr::router::proxy
