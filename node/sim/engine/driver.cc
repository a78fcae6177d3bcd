#include "node/sim/engine/driver.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <variant>

#include "proto/base/log.h"
#include "node/sim/engine/metrics.h"
#include "node/sim/engine/kv_transfer_model.h"

namespace pdr::node::sim {
namespace {

using Clock = std::chrono::steady_clock;

struct SubmitCommand {
  EngineArrival arrival;
};
struct CancelCommand {
  uint64_t key = 0;
};
struct RemoteReadyCommand {
  uint64_t key = 0;
  bool ok = false;
};
struct ResetCommand {};
using Command = std::variant<SubmitCommand, CancelCommand, RemoteReadyCommand, ResetCommand>;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

struct SimEngine::Impl {
  // What the driver keeps of a request beside the scheduler's state.
  struct Request {
    uint32_t rank = 0;
    uint32_t route = 0;
    Clock::time_point arrival;
    Clock::time_point last_token;
    bool any_token = false;
    uint32_t remote_tokens = 0;
    bool hold = false;  // finished, its blocks kept until cancel()
    // Remote KV: both the real pull and the modelled transfer must end.
    bool loading = false;
    bool real_done = false;
    bool real_ok = false;
    bool model_done = false;
  };
  struct Rank {
    std::unique_ptr<EngineScheduler> scheduler;
    bool stepping = false;
    Clock::time_point step_end;
    bool dirty = false;  // something changed since it went idle: try to schedule
  };

  SimEngineOptions options;
  EngineNoticeSink notice_sink;
  EngineEventsSink events_sink;
  EngineMetrics metrics;

  std::mutex commands_mu;
  std::vector<Command> commands;
  bool stopping = false;  // under commands_mu
  int epoll_fd = -1;
  int wake_fd = -1;
  int timer_fd = -1;
  std::thread thread;

  // Engine thread only.
  std::vector<Rank> ranks;
  std::unordered_map<uint64_t, Request> requests;
  KvTransferModel transfers;
  Clock::time_point origin = Clock::now();
  std::vector<EngineNotice> notices;

  Impl(SimEngineOptions o, EngineNoticeSink n, EngineEventsSink e)
      : options(std::move(o)),
        notice_sink(std::move(n)),
        events_sink(std::move(e)),
        metrics(options.ranks, options.model),
        transfers(options.profile.kv_transfer_latency_ms, options.profile.kv_transfer_gbps,
                  options.profile.kv_node_gbps) {
    options.ranks = std::max<uint32_t>(1, options.ranks);
    ranks.resize(options.ranks);
    for (Rank& r : ranks) r.scheduler = std::make_unique<EngineScheduler>(options.profile);
  }
  ~Impl() {
    for (int fd : {epoll_fd, wake_fd, timer_fd}) {
      if (fd >= 0) ::close(fd);
    }
  }

  void post(Command command) {
    {
      std::lock_guard<std::mutex> lock(commands_mu);
      if (stopping) return;
      commands.push_back(std::move(command));
    }
    wake();
  }
  void wake() {
    const uint64_t one = 1;
    // A full counter (impossible in practice) still leaves the eventfd readable.
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof(one));
  }

  // Modelled milliseconds since the engine started (the transfer model's clock).
  double model_ms(Clock::time_point t) const {
    return std::chrono::duration<double, std::milli>(t - origin).count() / options.time_scale;
  }
  Clock::time_point wall_time(double model_ms_value) const {
    return origin + std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double, std::milli>(model_ms_value * options.time_scale));
  }
  Clock::duration scaled(double ms) const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms * options.time_scale));
  }

  void run();
  void apply(Command& command, Clock::time_point now);
  void start_step(uint32_t rank, Clock::time_point at);
  void end_step(uint32_t rank, Clock::time_point at);
  void maybe_loaded(uint64_t key);
  void publish_events(uint32_t rank);
  void refresh_stats();
  void arm_timer();
};

void SimEngine::Impl::apply(Command& command, Clock::time_point now) {
  if (auto* submit = std::get_if<SubmitCommand>(&command)) {
    EngineArrival& a = submit->arrival;
    const uint32_t rank = a.rank < ranks.size() ? a.rank : 0;
    if (requests.contains(a.key)) {
      pdr::log::warn("sim engine: request key {} submitted twice; the second is ignored", a.key);
      return;
    }
    Request info;
    info.rank = rank;
    info.route = a.route;
    info.arrival = a.arrival;
    info.remote_tokens = a.spec.remote_tokens;
    info.hold = a.spec.hold_blocks_after_finish;
    a.spec.id = a.key;
    if (!ranks[rank].scheduler->add(std::move(a.spec))) {
      // The server checks lengths first; a refusal here leaves the request without tokens, so
      // say why.
      pdr::log::warn("sim engine: request key {} refused by the scheduler", a.key);
      return;
    }
    requests.emplace(a.key, info);
    ranks[rank].dirty = true;
  } else if (auto* cancel = std::get_if<CancelCommand>(&command)) {
    auto it = requests.find(cancel->key);
    if (it == requests.end()) return;
    const uint32_t rank = it->second.rank;
    if (it->second.loading && !it->second.model_done) transfers.cancel(cancel->key, model_ms(now));
    ranks[rank].scheduler->cancel(cancel->key);
    requests.erase(it);
    ranks[rank].dirty = true;  // its blocks or seat may let another request in
  } else if (auto* ready = std::get_if<RemoteReadyCommand>(&command)) {
    auto it = requests.find(ready->key);
    if (it == requests.end() || !it->second.loading || it->second.real_done) return;
    it->second.real_done = true;
    it->second.real_ok = ready->ok;
    if (!ready->ok && !it->second.model_done) {
      transfers.cancel(ready->key, model_ms(now));
      it->second.model_done = true;
    }
    maybe_loaded(ready->key);
  } else if (std::holds_alternative<ResetCommand>(command)) {
    for (uint32_t r = 0; r < ranks.size(); ++r) {
      if (!ranks[r].scheduler->reset_prefix_cache()) {
        pdr::log::warn("sim engine: rank {}: prefix cache not reset, blocks are in use", r);
        continue;
      }
      metrics.update([r](std::vector<EngineRankMetrics>& m) { ++m[r].cache_clears; });
      events_sink(r, {});
    }
  }
}

void SimEngine::Impl::maybe_loaded(uint64_t key) {
  auto it = requests.find(key);
  if (it == requests.end()) return;
  Request& r = it->second;
  if (!r.loading || !r.real_done || !r.model_done) return;
  r.loading = false;
  ranks[r.rank].scheduler->remote_kv_done(key, r.real_ok);
  ranks[r.rank].dirty = true;
}

void SimEngine::Impl::start_step(uint32_t rank, Clock::time_point at) {
  Rank& rk = ranks[rank];
  rk.dirty = false;
  EngineStep step = rk.scheduler->schedule();
  for (const EngineAdmission& a : step.admitted) {
    auto it = requests.find(a.id);
    if (it == requests.end()) continue;
    const double queued = seconds_between(it->second.arrival, at);
    metrics.update([&](std::vector<EngineRankMetrics>& m) { m[rank].queue.record(queued); });
    notices.push_back({.kind = EngineNotice::Kind::kAdmitted, .key = a.id, .route = it->second.route,
                       .cached_tokens = a.cached_tokens, .queried_tokens = a.queried_tokens});
  }
  for (const EngineAdmission& a : step.load_remote) {
    auto it = requests.find(a.id);
    if (it == requests.end()) continue;
    Request& r = it->second;
    r.loading = true;
    const uint64_t tokens = r.remote_tokens > a.cached_tokens ? r.remote_tokens - a.cached_tokens : 0;
    transfers.start(a.id, tokens * options.profile.kv_bytes_per_token, model_ms(at));
    notices.push_back({.kind = EngineNotice::Kind::kLoadRemote, .key = a.id, .route = r.route,
                       .cached_tokens = a.cached_tokens, .queried_tokens = a.queried_tokens});
  }
  if (step.batch.empty()) {
    publish_events(rank);  // evictions for a remote load's blocks happen without a step
    return;
  }
  rk.stepping = true;
  rk.step_end = at + scaled(step.duration_ms);
}

void SimEngine::Impl::end_step(uint32_t rank, Clock::time_point at) {
  Rank& rk = ranks[rank];
  rk.stepping = false;
  const std::vector<EngineToken> tokens = rk.scheduler->complete_step();
  metrics.update([&](std::vector<EngineRankMetrics>& m) {
    for (const EngineToken& t : tokens) {
      auto it = requests.find(t.id);
      if (it == requests.end()) continue;
      Request& r = it->second;
      if (!r.any_token) {
        m[rank].ttft.record(seconds_between(r.arrival, at));
      } else {
        m[rank].inter_token.record(seconds_between(r.last_token, at));
      }
      r.any_token = true;
      r.last_token = at;
      if (t.finished) m[rank].e2e.record(seconds_between(r.arrival, at));
    }
  });
  for (const EngineToken& t : tokens) {
    auto it = requests.find(t.id);
    if (it == requests.end()) continue;
    notices.push_back({.kind = EngineNotice::Kind::kToken, .key = t.id, .route = it->second.route,
                       .index = t.index, .finished = t.finished});
    if (t.finished && !it->second.hold) requests.erase(it);  // a held one waits for cancel()
  }
  publish_events(rank);
}

void SimEngine::Impl::publish_events(uint32_t rank) {
  std::vector<PrefixCacheChange> changes = ranks[rank].scheduler->take_kv_events();
  if (!changes.empty()) events_sink(rank, std::move(changes));
}

void SimEngine::Impl::refresh_stats() {
  metrics.update([&](std::vector<EngineRankMetrics>& m) {
    for (size_t r = 0; r < ranks.size(); ++r) m[r].stats = ranks[r].scheduler->stats();
  });
}

void SimEngine::Impl::arm_timer() {
  std::optional<Clock::time_point> next;
  for (const Rank& r : ranks) {
    if (r.stepping && (!next || r.step_end < *next)) next = r.step_end;
  }
  if (auto t = transfers.next_completion_ms()) {
    const Clock::time_point when = wall_time(*t);
    if (!next || when < *next) next = when;
  }
  itimerspec spec{};  // all zero: disarmed
  if (next) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(next->time_since_epoch()).count();
    // steady_clock is CLOCK_MONOTONIC; a zero it_value would disarm, so never ask for time 0.
    spec.it_value.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    spec.it_value.tv_nsec = static_cast<long>(std::max<int64_t>(1, ns % 1'000'000'000));
  }
  ::timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &spec, nullptr);
}

void SimEngine::Impl::run() {
  std::vector<Command> batch;
  while (true) {
    epoll_event events[2];
    const int n = ::epoll_wait(epoll_fd, events, 2, -1);
    if (n < 0 && errno != EINTR) {
      pdr::log::error("sim engine: epoll_wait: {}", std::strerror(errno));
      return;
    }
    uint64_t drained = 0;
    [[maybe_unused]] ssize_t r = ::read(wake_fd, &drained, sizeof(drained));
    r = ::read(timer_fd, &drained, sizeof(drained));
    {
      std::lock_guard<std::mutex> lock(commands_mu);
      if (stopping) return;
      batch.swap(commands);
    }
    Clock::time_point now = Clock::now();
    for (Command& c : batch) apply(c, now);
    batch.clear();
    for (uint64_t key : transfers.advance(model_ms(now))) {
      auto it = requests.find(key);
      if (it == requests.end()) continue;
      it->second.model_done = true;
      maybe_loaded(key);
    }
    for (uint32_t rank = 0; rank < ranks.size(); ++rank) {
      Rank& rk = ranks[rank];
      // Steps that ended by now, each next one starting where the last ended.
      while (rk.stepping && rk.step_end <= now) {
        const Clock::time_point end = rk.step_end;
        end_step(rank, end);
        start_step(rank, now - end > kMaxLag ? now : end);
      }
      if (!rk.stepping && rk.dirty) start_step(rank, now);
    }
    refresh_stats();
    if (!notices.empty()) notice_sink(std::exchange(notices, {}));
    arm_timer();
  }
}

SimEngine::SimEngine(SimEngineOptions options, EngineNoticeSink notices, EngineEventsSink events)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(notices), std::move(events))) {}

SimEngine::~SimEngine() { stop(); }

Status SimEngine::start() {
  Impl& m = *impl_;
  m.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  m.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  m.timer_fd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (m.epoll_fd < 0 || m.wake_fd < 0 || m.timer_fd < 0) {
    return Status(StatusCode::kIoError, std::string("sim engine: ") + std::strerror(errno));
  }
  for (int fd : {m.wake_fd, m.timer_fd}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (::epoll_ctl(m.epoll_fd, EPOLL_CTL_ADD, fd, &event) != 0) {
      return Status(StatusCode::kIoError, std::string("sim engine: epoll_ctl: ") + std::strerror(errno));
    }
  }
  m.refresh_stats();
  m.thread = std::thread([&m] { m.run(); });
  return Status::ok();
}

void SimEngine::stop() {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.commands_mu);
    if (m.stopping) return;
    m.stopping = true;
  }
  if (m.thread.joinable()) {
    m.wake();
    m.thread.join();
  }
}

void SimEngine::submit(EngineArrival arrival) { impl_->post(SubmitCommand{std::move(arrival)}); }
void SimEngine::cancel(uint64_t key) { impl_->post(CancelCommand{key}); }
void SimEngine::remote_kv_ready(uint64_t key, bool ok) { impl_->post(RemoteReadyCommand{key, ok}); }
void SimEngine::reset_prefix_cache() { impl_->post(ResetCommand{}); }

std::string SimEngine::metrics_text() const { return impl_->metrics.text(); }

nlohmann::json SimEngine::prefix_cache_json() const {
  return impl_->metrics.prefix_cache_json(impl_->options.profile.block_size,
                                          impl_->options.profile.num_gpu_blocks);
}

const SimEngineOptions& SimEngine::options() const { return impl_->options; }

}  // namespace pdr::node::sim
