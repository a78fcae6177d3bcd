#include "discovery/sources/kubernetes/pod_watcher.h"

#include "proto/base/log.h"

#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "router/http/upstream_client.h"
#include "proto/etcd_json.h"
#include "proto/k8s_pods.h"
#include "discovery/sources/kubernetes/pod_node.h"
#include "discovery/sources/loop_thread.h"

namespace pdr::discovery::sources::kubernetes {

namespace {

constexpr size_t kMaxTokenBytes = 64 * 1024;
constexpr size_t kMaxErrorBodyBytes = 64 * 1024;

// A change for the registry: upsert (reg set) or remove `key`.
struct Change {
  std::string key;
  std::optional<proto::Registration> reg;
};

// What one pod currently stands for in the registry.
struct PodEntry {
  std::string key;
  proto::Registration reg;
};

}  // namespace

class PodWatcher::Impl {
 public:
  explicit Impl(PodWatcher& owner)
      : owner_(owner), status_(owner.status_), k8s_(owner.options_.kubernetes) {}
  ~Impl() { loop_.stop(); }  // before the members its stop handler uses go

  http::PoolOptions pool_options() const {
    http::PoolOptions pool;
    pool.tls = owner_.options_.tls;
    return pool;
  }

  Status start() {
    base_path_ = "/api/v1/namespaces/" + k8s_.namespace_name + "/pods";
    return loop_.start(
        [this] {
          retry_timer_ = &loop_.timer("retry", [this] { retry(); });
          pool_ = std::make_unique<http::UpstreamPool>(loop_.loop(), pool_options());
          list();
        },
        [this] { begin_stop(); });
  }

  void stop() {
    loop_.stop();
    set_state("stopped");
  }

  std::string state() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return state_;
  }
  std::string last_error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_error_;
  }
  std::string resource_version() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return resource_version_;
  }

 private:
  void set_state(std::string state) {
    std::lock_guard<std::mutex> lock(mutex_);
    state_ = std::move(state);
  }
  void set_resource_version(const std::string& rv) {
    if (rv.empty()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    resource_version_ = rv;
  }
  std::string current_rv() const { return resource_version(); }

  // --- requests ---

  // Bearer token from the file, re-read when older than token_refresh. Never logged.
  void refresh_token() {
    if (k8s_.token_file.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (token_read_ && now - token_read_at_ < k8s_.token_refresh) return;
    token_read_ = true;
    token_read_at_ = now;
    std::ifstream in(k8s_.token_file, std::ios::binary);
    std::string text;
    if (in) {
      text.resize(kMaxTokenBytes + 1);
      in.read(text.data(), static_cast<std::streamsize>(text.size()));
      text.resize(static_cast<size_t>(in.gcount()));
    }
    if (!in && !in.eof()) text.clear();
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
    const bool usable = !text.empty() && text.size() <= kMaxTokenBytes &&
                        text.find_first_of("\r\n") == std::string::npos;
    if (!usable) {
      if (!token_warned_) {
        pdr::log::warn("kubernetes: no usable token in {} (sending requests without one)", k8s_.token_file);
        token_warned_ = true;
      }
      token_.clear();
      return;
    }
    token_warned_ = false;
    token_ = std::move(text);
  }

  http::UpstreamRequest get(std::string path) {
    refresh_token();
    http::UpstreamRequest request;
    request.method = "GET";
    request.path = std::move(path);
    request.headers.push_back({"Accept", "application/json"});
    if (!token_.empty()) request.headers.push_back({"Authorization", "Bearer " + token_});
    return request;
  }

  std::string selector_query() const {
    return k8s_.label_selector.empty() ? std::string() : "labelSelector=" + proto::url_query_escape(k8s_.label_selector);
  }

  // Why an HTTP error answer failed, from its Status body when it has one.
  static std::string http_error(int status, const std::string& body) {
    int code = 0;
    std::string reason, message;
    std::string text = "HTTP " + std::to_string(status);
    if (proto::parse_k8s_status(body, &code, &reason, &message)) {
      if (!reason.empty()) text += " " + reason;
      if (!message.empty()) text += ": " + message;
    }
    return text;
  }

  // --- list ---

  void list() {
    const uint64_t gen = ++generation_;
    set_state("listing");
    struct State {
      int status = 0;
      std::string body;
      bool over = false;
    };
    auto state = std::make_shared<State>();
    http::UpstreamCallbacks callbacks;
    callbacks.on_head = [state](int status, const std::vector<http::Header>&) { state->status = status; };
    callbacks.on_body = [state](std::string_view chunk) {
      if (state->over) return;
      if (state->body.size() + chunk.size() > proto::kMaxPodListBytes) {
        state->over = true;
        state->body.clear();
        return;
      }
      state->body.append(chunk);
    };
    callbacks.on_complete = [this, gen, state] {
      if (gen != generation_) return;
      if (state->over) {
        status_.bad_events.fetch_add(1, std::memory_order_relaxed);
        return fail(gen, "list: answer over " + std::to_string(proto::kMaxPodListBytes) + " bytes");
      }
      if (state->status != 200) return fail(gen, "list: " + http_error(state->status, state->body));
      proto::PodList pods;
      if (Status st = proto::parse_pod_list(state->body, &pods); !st) {
        status_.bad_events.fetch_add(1, std::memory_order_relaxed);
        return fail(gen, "list: " + st.message());
      }
      on_list(pods);
      watch(gen);
    };
    callbacks.on_error = [this, gen](const Status& error) {
      if (gen != generation_) return;
      fail(gen, "list: " + error.message());
    };
    const std::string query = selector_query();
    call_ = pool_->start(k8s_.api_server, get(base_path_ + (query.empty() ? "" : "?" + query)),
                         http::UpstreamTimeouts{owner_.options_.request_timeout, owner_.options_.request_timeout,
                                                owner_.options_.request_timeout},
                         std::move(callbacks));
  }

  void on_list(const proto::PodList& list) {
    last_list_at_ = std::chrono::steady_clock::now();
    status_.lists.fetch_add(1, std::memory_order_relaxed);
    if (relist_pending_) status_.relists.fetch_add(1, std::memory_order_relaxed);
    relist_pending_ = false;
    set_resource_version(list.resource_version);
    std::map<std::string, PodEntry> fresh;
    std::vector<Change> changes;
    for (const proto::PodInfo& pod : list.items) {
      std::optional<PodEntry> entry = entry_of(pod, false);
      if (entry) fresh[pod.name] = std::move(*entry);
    }
    std::map<std::string, bool> fresh_keys;
    for (const auto& [name, entry] : fresh) fresh_keys[entry.key] = true;
    for (const auto& [name, old] : pods_) {
      if (!fresh_keys.contains(old.key)) changes.push_back({old.key, std::nullopt});
    }
    for (const auto& [name, entry] : fresh) {
      auto it = pods_.find(name);
      if (it == pods_.end() || it->second.key != entry.key || !(it->second.reg == entry.reg)) {
        changes.push_back({entry.key, entry.reg});
      }
    }
    pods_ = std::move(fresh);
    apply(std::move(changes));
  }

  // --- watch ---

  void watch(uint64_t gen) {
    set_state("watching");
    status_.watches.fetch_add(1, std::memory_order_relaxed);
    splitter_ = std::make_unique<proto::EtcdLineSplitter>(proto::kMaxPodWatchLineBytes);
    struct State {
      int status = 0;
      std::string error_body;
      bool delivered = false;
      std::chrono::steady_clock::time_point opened = std::chrono::steady_clock::now();
    };
    auto state = std::make_shared<State>();
    http::UpstreamCallbacks callbacks;
    callbacks.on_head = [this, gen, state](int status, const std::vector<http::Header>&) {
      if (gen != generation_) return;
      state->status = status;
      if (status == 200) {
        status_.watching.store(true, std::memory_order_relaxed);
        if (!last_warned_.empty()) pdr::log::info("kubernetes: watching pods again");
        last_warned_.clear();
      }
    };
    callbacks.on_body = [this, gen, state](std::string_view chunk) {
      if (gen != generation_) return;
      if (state->status != 200) {
        if (state->error_body.size() + chunk.size() <= kMaxErrorBodyBytes) state->error_body.append(chunk);
        return;
      }
      if (!splitter_->feed(chunk)) {
        status_.bad_events.fetch_add(1, std::memory_order_relaxed);
        return fail(gen, "watch: a line over " + std::to_string(proto::kMaxPodWatchLineBytes) + " bytes");
      }
      std::string_view line;
      while (splitter_->next_line(&line)) {
        state->delivered = true;
        on_watch_line(gen, line);
        if (gen != generation_) return;  // relisting or failed
      }
    };
    callbacks.on_complete = [this, gen, state] {
      if (gen != generation_) return;
      status_.watching.store(false, std::memory_order_relaxed);
      if (state->status == 410) return relist(gen, "watch: HTTP 410 Gone");
      if (state->status != 200) return fail(gen, "watch: " + http_error(state->status, state->error_body));
      // The server ended the stream (timeoutSeconds, a restart): open it again from the last
      // resourceVersion, at once unless it ended straight away with nothing in it.
      const bool quick = !state->delivered && std::chrono::steady_clock::now() - state->opened < std::chrono::seconds(1);
      if (quick) return fail(gen, "watch: the server closed an empty stream at once");
      ++generation_;
      watch(generation_);
    };
    callbacks.on_error = [this, gen](const Status& error) {
      if (gen != generation_) return;
      fail(gen, "watch: " + error.message());
    };
    std::string path = base_path_ + "?";
    const std::string query = selector_query();
    if (!query.empty()) path += query + "&";
    path += "watch=1&resourceVersion=" + proto::url_query_escape(current_rv()) +
            "&allowWatchBookmarks=true&timeoutSeconds=" + std::to_string(k8s_.watch_timeout.count());
    // Idle: bookmarks and the server's own timeoutSeconds keep a healthy stream well inside it.
    const auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(k8s_.watch_timeout) +
                      std::chrono::milliseconds(60000);
    call_ = pool_->start(k8s_.api_server, get(std::move(path)),
                         http::UpstreamTimeouts{owner_.options_.request_timeout, owner_.options_.request_timeout, idle},
                         std::move(callbacks));
  }

  void on_watch_line(uint64_t gen, std::string_view line) {
    proto::PodEvent event;
    if (Status st = proto::parse_pod_watch_event(line, &event); !st) {
      status_.bad_events.fetch_add(1, std::memory_order_relaxed);
      note_error("watch: a line skipped: " + st.message());
      return;
    }
    switch (event.type) {
      case proto::PodEventType::kError:
        if (event.error_code == 410) return relist(gen, "watch: 410 " + event.error_reason);
        return fail(gen, "watch: ERROR " + std::to_string(event.error_code) + " " + event.error_reason + ": " +
                             event.error_message);
      case proto::PodEventType::kBookmark:
        status_.bookmarks.fetch_add(1, std::memory_order_relaxed);
        set_resource_version(event.pod.resource_version);
        return;
      case proto::PodEventType::kAdded:
      case proto::PodEventType::kModified:
      case proto::PodEventType::kDeleted:
        status_.events.fetch_add(1, std::memory_order_relaxed);
        set_resource_version(event.pod.resource_version);
        on_pod(event.pod, event.type == proto::PodEventType::kDeleted);
        return;
    }
  }

  void on_pod(const proto::PodInfo& pod, bool deleted) {
    std::optional<PodEntry> entry = entry_of(pod, deleted);
    std::vector<Change> changes;
    auto it = pods_.find(pod.name);
    if (it != pods_.end() && (!entry || entry->key != it->second.key)) {
      // Pod IPs are reused: another pod may stand at this address now (its ADDED can come
      // before this one's DELETED). Then the entry becomes that pod's instead of going.
      const PodEntry* other = other_pod_at(it->second.key, pod.name);
      if (other != nullptr) {
        changes.push_back({other->key, other->reg});
      } else {
        changes.push_back({it->second.key, std::nullopt});
      }
    }
    if (entry && (it == pods_.end() || it->second.key != entry->key || !(it->second.reg == entry->reg))) {
      changes.push_back({entry->key, entry->reg});
    }
    if (entry) {
      pods_[pod.name] = std::move(*entry);
    } else if (it != pods_.end()) {
      pods_.erase(it);
    }
    apply(std::move(changes));
  }

  const PodEntry* other_pod_at(const std::string& key, const std::string& except) const {
    for (const auto& [name, entry] : pods_) {
      if (name != except && entry.key == key) return &entry;
    }
    return nullptr;
  }

  // The registry entry `pod` stands for now, or none.
  std::optional<PodEntry> entry_of(const proto::PodInfo& pod, bool deleted) {
    if (deleted || !proto_pod_serving(pod)) return std::nullopt;
    proto::Registration reg;
    if (Status st = pod_registration(pod, k8s_, owner_.options_.connectors, &reg); !st) {
      if (st.code() == StatusCode::kNotFound) {  // matches neither selector: not ours, no error
        pod_errors_.erase(pod.name);
        return std::nullopt;
      }
      status_.bad_pods.fetch_add(1, std::memory_order_relaxed);
      if (st.code() == StatusCode::kRejected) status_.ambiguous_pods.fetch_add(1, std::memory_order_relaxed);
      std::string& seen = pod_errors_[pod.name];
      if (seen != st.message()) {
        pdr::log::warn("kubernetes: pod {} is not a node: {}", pod.name, st.message());
        seen = st.message();
      }
      return std::nullopt;
    }
    pod_errors_.erase(pod.name);
    std::string key = reg.http_address.to_string();
    return PodEntry{std::move(key), std::move(reg)};
  }
  static bool proto_pod_serving(const proto::PodInfo& pod) { return pod_is_serving(pod); }

  void apply(std::vector<Change> changes) {
    status_.pods.store(pods_.size(), std::memory_order_relaxed);
    if (changes.empty()) return;
    owner_.discovery_.post([changes = std::move(changes)](discovery::Registry& registry) {
      const auto now = discovery::Clock::now();
      for (const Change& c : changes) {
        if (c.reg) {
          const auto outcome = registry.upsert_kubernetes(*c.reg, now);
          if (outcome.result == discovery::AdminResult::kConflict ||
              outcome.result == discovery::AdminResult::kRejectedFull) {
            pdr::log::warn("kubernetes: pod at {} not added: {}", c.key, outcome.message);
          }
        } else {
          (void)registry.remove_kubernetes(c.key);
        }
      }
    });
  }

  // --- failures ---

  void note_error(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex_);
    last_error_ = why;
  }

  void relist(uint64_t gen, const std::string& why) {
    if (gen != generation_) return;
    pdr::log::info("kubernetes: {}; listing again", why);
    note_error(why);
    status_.watching.store(false, std::memory_order_relaxed);
    if (call_) call_->cancel();
    relist_pending_ = true;
    // A server that answers 410 right after a list would make a busy loop: at most one list
    // per retry interval.
    if (std::chrono::steady_clock::now() - last_list_at_ < k8s_.retry) {
      ++generation_;
      set_state("retrying");
      retry_timer_->start(k8s_.retry);
      return;
    }
    list();
  }

  void fail(uint64_t gen, const std::string& why) {
    if (gen != generation_) return;
    ++generation_;  // every callback of this attempt is now stale
    status_.errors.fetch_add(1, std::memory_order_relaxed);
    status_.watching.store(false, std::memory_order_relaxed);
    note_error(why);
    // Once per distinct reason: an API server that stays down does not flood the log.
    if (why != last_warned_) {
      pdr::log::warn("kubernetes: {}; routing on the last view, retrying every {} ms", why, k8s_.retry.count());
      last_warned_ = why;
    }
    if (call_) call_->cancel();
    set_state("retrying");
    if (!stopping_) retry_timer_->start(k8s_.retry);
  }

  void retry() {
    // From the last resourceVersion when there is one (a 410 then makes it list again).
    if (relist_pending_ || current_rv().empty()) return list();
    ++generation_;
    watch(generation_);
  }

  // --- shutdown ---

  void begin_stop() {
    stopping_ = true;
    ++generation_;
    if (call_) call_->cancel();
    call_.reset();
    pool_.reset();  // closes its connections; no callback fires after this
    loop_.quit();   // and the retry timer
  }

  PodWatcher& owner_;
  PodWatcherStatus& status_;
  const config::Topology::Kubernetes& k8s_;
  LoopThread loop_{"kubernetes"};
  LoopThread::Timer* retry_timer_ = nullptr;
  std::unique_ptr<http::UpstreamPool> pool_;
  std::shared_ptr<http::UpstreamCall> call_;
  std::unique_ptr<proto::EtcdLineSplitter> splitter_;
  std::string base_path_;
  uint64_t generation_ = 0;
  bool relist_pending_ = false;  // a 410 asked for a list; counted as a relist once it answers
  std::chrono::steady_clock::time_point last_list_at_{};
  std::string last_warned_;  // the failure last logged, "" once a watch is open again
  bool stopping_ = false;
  std::string token_;
  bool token_read_ = false;
  bool token_warned_ = false;
  std::chrono::steady_clock::time_point token_read_at_{};
  std::map<std::string, PodEntry> pods_;          // pod name -> its registry entry
  std::map<std::string, std::string> pod_errors_;  // pod name -> why it is not a node (logged once)
  mutable std::mutex mutex_;
  std::string state_ = "starting";
  std::string last_error_;
  std::string resource_version_;
};

PodWatcher::PodWatcher(discovery::DiscoveryService& discovery) : discovery_(discovery) {}

PodWatcher::~PodWatcher() { stop(); }

Status PodWatcher::start(PodWatcherOptions options) {
  if (options.kubernetes.namespace_name.empty() || options.kubernetes.api_server.host.empty()) {
    return Status(StatusCode::kInvalidValue, "kubernetes: api_server and namespace are required");
  }
  options_ = std::move(options);
  impl_ = std::make_unique<Impl>(*this);
  return impl_->start();
}

void PodWatcher::stop() {
  // impl_ stays until destruction: /status may still read it while the HTTP workers drain.
  if (impl_) impl_->stop();
}

std::string PodWatcher::state() const { return impl_ ? impl_->state() : std::string("stopped"); }
std::string PodWatcher::last_error() const { return impl_ ? impl_->last_error() : std::string(); }
std::string PodWatcher::resource_version() const { return impl_ ? impl_->resource_version() : std::string(); }

}  // namespace pdr::discovery::sources::kubernetes
