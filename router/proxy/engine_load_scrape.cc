#include "router/proxy/engine_load_scrape.h"

#include <algorithm>
#include <utility>

#include "discovery/load_charge.h"
#include "proto/base/metrics_writer.h"
#include "proto/engine_load_page.h"
#include "router/proxy/node_metrics_fetch.h"
#include "router/routing/pairing.h"
#include "router/proxy/proxy_shared.h"

namespace pdr::router::proxy {

namespace {

using discovery::EngineScrapeFailure;

EngineScrapeFailure failure_of(const NodeMetricsAnswer& a) {
  switch (a.result) {
    case NodeMetricsAnswer::Result::kOk: return EngineScrapeFailure::kNone;
    case NodeMetricsAnswer::Result::kStatus: return EngineScrapeFailure::kStatus;
    case NodeMetricsAnswer::Result::kTooLarge: return EngineScrapeFailure::kTooLarge;
    case NodeMetricsAnswer::Result::kError: break;
  }
  switch (a.failure) {
    case http::UpstreamFailure::kConnectTimeout:
    case http::UpstreamFailure::kFirstByteTimeout:
    case http::UpstreamFailure::kIdleTimeout: return EngineScrapeFailure::kTimeout;
    case http::UpstreamFailure::kBadResponse: return EngineScrapeFailure::kMalformed;
    default: return EngineScrapeFailure::kConnect;
  }
}

}  // namespace

EngineScrapeCounters& engine_scrape_counters() {
  static EngineScrapeCounters counters;
  return counters;
}

EngineLoadScrape::EngineLoadScrape(WorkerContext& worker) : worker_(worker) {}

EngineLoadScrape::~EngineLoadScrape() {
  tick_.stop();
  for (auto& [key, read] : reads_) {
    if (read->call) read->call->cancel();  // no callback of it runs any more
  }
}

void EngineLoadScrape::start() { tick_.start(worker_.timers(), std::chrono::milliseconds(0), [this] { tick(); }); }

void EngineLoadScrape::tick() {
  // Copies: begin() reads the worker's topology again, which may move its cached pointer on.
  const std::shared_ptr<const config::Topology> topology = worker_.topology();
  const config::Topology::LoadSignals& cfg = topology->load_signals;
  // Re-armed first: a tick that starts no read (scrape off, no node) still comes back, so a
  // reload turning the scrape on takes effect within one interval.
  tick_.start(worker_.timers(), cfg.interval, [this] { tick(); });
  if (!cfg.scrape_engine_metrics) return;
  const std::shared_ptr<const discovery::RegistrySnapshot> snapshot = worker_.registry();
  for (const auto& inst : snapshot->instances) {
    if (!routable(*inst) || reads_.contains(inst->liveness.get())) continue;
    begin(inst);
  }
}

void EngineLoadScrape::begin(const std::shared_ptr<const discovery::Instance>& node) {
  const std::shared_ptr<const config::Topology> topology = worker_.topology();
  const config::Topology::LoadSignals& cfg = topology->load_signals;
  const discovery::InstanceLiveness* key = node->liveness.get();
  auto read = std::make_unique<Read>();
  read->cell = node->liveness;
  Read& r = *read;
  reads_.emplace(key, std::move(read));
  // The pool's own timeouts bound each phase; the deadline below bounds the whole read (a node
  // trickling its page byte by byte passes every phase timeout).
  const http::UpstreamTimeouts timeouts{std::min(cfg.timeout, topology->timeouts.connect), cfg.timeout, cfg.timeout};
  r.deadline.start(worker_.timers(), cfg.timeout, [this, key] {
    auto it = reads_.find(key);
    if (it == reads_.end()) return;
    if (it->second->call) it->second->call->cancel();
    failed(key, EngineScrapeFailure::kTimeout);
  });
  r.call = fetch_node_metrics(worker_, *node, timeouts, cfg.max_body_bytes,
                              [this, key](NodeMetricsAnswer&& answer) {
                                const EngineScrapeFailure why = failure_of(answer);
                                if (why != EngineScrapeFailure::kNone) return failed(key, why);
                                answered(key, std::move(answer.body));
                              });
}

void EngineLoadScrape::failed(const discovery::InstanceLiveness* key, EngineScrapeFailure why) {
  auto it = reads_.find(key);
  if (it == reads_.end()) return;
  it->second->cell->engine_load.fail(why, discovery::Clock::now());
  engine_scrape_counters().failures[static_cast<size_t>(why)].fetch_add(1, std::memory_order_relaxed);
  reads_.erase(it);  // its deadline (perhaps the caller) and call handle go with it
}

void EngineLoadScrape::answered(const discovery::InstanceLiveness* key, std::string&& body) {
  auto it = reads_.find(key);
  if (it == reads_.end()) return;
  const proto::EngineLoadPage page = proto::read_engine_load_page(body);
  switch (page.outcome) {
    case proto::EngineLoadPage::Outcome::kOk: break;
    case proto::EngineLoadPage::Outcome::kMalformed: return failed(key, EngineScrapeFailure::kMalformed);
    case proto::EngineLoadPage::Outcome::kMissingFamilies: return failed(key, EngineScrapeFailure::kMissingFamilies);
  }
  discovery::InstanceLiveness& cell = *it->second->cell;
  cell.engine_load.store(page, discovery::node_load(cell).requests, cell.ledger, discovery::Clock::now(),
                         worker_.topology()->load_signals.stale_after);
  engine_scrape_counters().reads.fetch_add(1, std::memory_order_relaxed);
  reads_.erase(it);
}

void write_engine_scrape_metrics(MetricsWriter& out) {
  const EngineScrapeCounters& c = engine_scrape_counters();
  out.counter("pdrouter_engine_scrape_reads_total",
              "Node /metrics pages the load scrape read and stored (load_signals.scrape_engine_metrics)",
              static_cast<double>(c.reads.load(std::memory_order_relaxed)));
  for (size_t i = 1; i < c.failures.size(); ++i) {
    out.counter("pdrouter_engine_scrape_failures_total",
                "Node /metrics reads of the load scrape that stored nothing, by reason",
                static_cast<double>(c.failures[i].load(std::memory_order_relaxed)),
                {{"reason", std::string(discovery::to_string(static_cast<EngineScrapeFailure>(i)))}});
  }
}

}  // namespace pdr::router::proxy
