#include "discovery/config/topology_store.h"

#include <fmt/format.h>
#include "proto/base/log.h"

#include <cctype>
#include <fstream>
#include <tuple>
#include <utility>

namespace pdr::config {

namespace {

// An empty file parses as the all-defaults topology, but on a reload it is nearly always a
// writer caught between truncating and writing (`cat good > topology.yaml`, `cp`), or a file
// emptied by mistake: applying it would drop every static instance and disable the admin API
// (a half-written file applied live). So a reload refuses a file with nothing but whitespace; start-up
// still accepts it (defaults, as documented).
Status refuse_empty_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::ok();  // load_topology_file reports why it cannot be opened
  char buffer[4096];
  uint64_t total = 0;
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    const std::streamsize got = in.gcount();
    for (std::streamsize i = 0; i < got; ++i) {
      if (!std::isspace(static_cast<unsigned char>(buffer[i]))) return Status::ok();
    }
    total += static_cast<uint64_t>(got);
    if (total > (1u << 20)) return Status::ok();  // over the size limit: load_topology_file says so
  }
  return Status(StatusCode::kInvalidValue,
                fmt::format("{}: the file is empty{}; refusing to reload an empty topology (it would "
                            "reset everything to defaults). Write the full topology, or restart "
                            "pdrouter to run on defaults",
                            path, total == 0 ? "" : " (whitespace only)"));
}

}  // namespace

TopologyStore::TopologyStore() : cell_(std::make_shared<const Topology>()) {}

Status TopologyStore::load_initial(const std::string& path) {
  auto loaded = std::make_shared<Topology>();
  if (!path.empty()) {
    Status s = load_topology_file(path, loaded.get());
    if (!s) return s;
  }
  path_ = path;
  cell_.publish(std::move(loaded));
  return Status::ok();
}

Status TopologyStore::reload() {
  std::lock_guard<std::mutex> serialise(reload_mutex_);
  if (path_.empty())
    return Status(StatusCode::kNotFound, "no topology file was given; nothing to reload");
  auto next = std::make_shared<Topology>();
  Status s = refuse_empty_file(path_);
  if (s) s = load_topology_file(path_, next.get());
  // The outcome is recorded before the count moves: a reader that sees the new count (a test
  // polling /metrics, /status whose cached page is keyed on the counts) must also see this
  // reload's last_error, not the previous one.
  if (!s) {
    record_outcome(s);
    reloads_failed_.fetch_add(1, std::memory_order_release);
    pdr::log::warn("topology reload rejected, keeping the current one: {}", s.message());
    return s;
  }
  std::shared_ptr<const Topology> old = cell_.load();
  std::shared_ptr<const Topology> published = std::move(next);
  cell_.publish(published);
  record_outcome(s);
  pdr::log::info("topology reloaded from {} ({} static instances)", path_,
               published->static_instances.size());

  // Copied so a listener may take its time without holding the lock add_listener() needs.
  std::vector<Listener> listeners;
  {
    std::lock_guard<std::mutex> lock(listeners_mutex_);
    listeners = listeners_;
  }
  for (const Listener& listener : listeners) listener(*old, *published);
  // Counted once the listeners applied it (discovery, TLS contexts): whoever waits for the count
  // finds the reload done.
  reloads_ok_.fetch_add(1, std::memory_order_release);
  return Status::ok();
}

void TopologyStore::add_listener(Listener listener) {
  std::lock_guard<std::mutex> lock(listeners_mutex_);
  listeners_.push_back(std::move(listener));
}

std::string TopologyStore::last_error() const {
  std::lock_guard<std::mutex> lock(outcome_mutex_);
  return last_error_;
}

std::optional<TopologyStore::TimePoint> TopologyStore::last_reload() const {
  std::lock_guard<std::mutex> lock(outcome_mutex_);
  return last_reload_;
}

void TopologyStore::record_outcome(const Status& status) {
  std::lock_guard<std::mutex> lock(outcome_mutex_);
  last_error_ = status.is_ok() ? std::string() : status.message();
  last_reload_ = std::chrono::system_clock::now();
}

std::vector<std::string> restart_required_changes(const Topology& a, const Topology& b) {
  std::vector<std::string> changes;
  if (a.listeners.http != b.listeners.http) {
    changes.push_back(fmt::format("listeners.http: {} -> {}", a.listeners.http.to_string(),
                                  b.listeners.http.to_string()));
  }
  if (a.listeners.admin != b.listeners.admin) {
    auto text = [](const std::optional<proto::HostPort>& hp) {
      return hp ? hp->to_string() : std::string("(unset)");
    };
    changes.push_back(fmt::format("listeners.admin: {} -> {}", text(a.listeners.admin),
                                  text(b.listeners.admin)));
  }
  if (a.listeners.discovery != b.listeners.discovery) {
    changes.push_back(
        fmt::format("listeners.discovery: {} -> {}", a.listeners.discovery, b.listeners.discovery));
  }
  // A listener's TLS is chosen when it starts; its certificates apply live (router/tls_contexts.h).
  for (const auto& [name, x, y] : {std::tuple{"listeners.tls", &a.listeners.tls, &b.listeners.tls},
                                   std::tuple{"listeners.admin_tls", &a.listeners.admin_tls, &b.listeners.admin_tls}}) {
    if (x->enabled() != y->enabled()) {
      changes.push_back(fmt::format("{}: {} -> {}", name, x->enabled() ? "on" : "off", y->enabled() ? "on" : "off"));
    }
  }
  // The span exporter is made once at start; only sampling_ratio applies live.
  const auto& tra = a.tracing;
  const auto& trb = b.tracing;
  if (tra.endpoint != trb.endpoint) {
    changes.push_back(fmt::format("tracing.endpoint: '{}' -> '{}'", tra.endpoint, trb.endpoint));
  }
  if (tra.service_name != trb.service_name || tra.max_queue_spans != trb.max_queue_spans || tra.batch != trb.batch ||
      tra.max_batch_spans != trb.max_batch_spans || tra.export_timeout != trb.export_timeout) {
    changes.push_back("tracing (service_name, max_queue_spans, batch_ms, max_batch_spans, export_timeout_ms)");
  }
  if (a.workers != b.workers)
    changes.push_back(fmt::format("workers: {} -> {}", a.workers, b.workers));
  // The subscriber and its index are made once at start (router/server.cc).
  const auto& ka = a.kv_events;
  const auto& kb = b.kv_events;
  if (ka.enabled != kb.enabled) changes.push_back(fmt::format("kv_events.enabled: {} -> {}", ka.enabled, kb.enabled));
  if (ka.default_port != kb.default_port) {
    auto text = [](const std::optional<uint16_t>& p) { return p ? std::to_string(*p) : std::string("(unset)"); };
    changes.push_back(fmt::format("kv_events.default_port: {} -> {}", text(ka.default_port), text(kb.default_port)));
  }
  if (ka.topic != kb.topic) changes.push_back(fmt::format("kv_events.topic: '{}' -> '{}'", ka.topic, kb.topic));
  if (ka.max_index_entries != kb.max_index_entries) {
    changes.push_back(
        fmt::format("kv_events.max_index_entries: {} -> {}", ka.max_index_entries, kb.max_index_entries));
  }
  for (const auto& [name, x, y] : {std::tuple{"max_node_batches_per_sec", ka.max_node_batches_per_sec,
                                              kb.max_node_batches_per_sec},
                                   std::tuple{"max_node_bytes_per_sec", ka.max_node_bytes_per_sec,
                                              kb.max_node_bytes_per_sec},
                                   std::tuple{"max_ranks_per_node", ka.max_ranks_per_node, kb.max_ranks_per_node},
                                   std::tuple{"max_subscriptions", ka.max_subscriptions, kb.max_subscriptions}}) {
    if (x != y) changes.push_back(fmt::format("kv_events.{}: {} -> {}", name, x, y));
  }
  // The prefix tree of cache-aware routing is made once at start, with its budget.
  const uint32_t ta = a.policies.cache_aware.prefix_tree_max_bytes;
  const uint32_t tb = b.policies.cache_aware.prefix_tree_max_bytes;
  if (ta != tb) changes.push_back(fmt::format("policies.cache_aware.prefix_tree_max_bytes: {} -> {}", ta, tb));
  // Pod discovery reads its section once at start (router/server.cc).
  const auto& ea = a.kubernetes;
  const auto& eb = b.kubernetes;
  if (ea.enabled != eb.enabled || ea.api_server_url != eb.api_server_url || ea.namespace_name != eb.namespace_name ||
      ea.label_selector != eb.label_selector || ea.token_file != eb.token_file || ea.role_label != eb.role_label ||
      ea.port != eb.port || ea.token_refresh != eb.token_refresh || ea.watch_timeout != eb.watch_timeout ||
      ea.retry != eb.retry || ea.prefill_selector != eb.prefill_selector || ea.decode_selector != eb.decode_selector) {
    changes.push_back("kubernetes: a setting changed");
  }
  return changes;
}

}  // namespace pdr::config
