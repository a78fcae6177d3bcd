// listener_bench: how DiscoveryService (discovery/discovery_service.h) copes with node
// registrations on loopback. One run measures
//   1. sustained throughput: K sender threads blast M pre-encoded MoRIIO registrations; the same
//      senders against a bare ZMQ ROUTER loop (receive only) give the ceiling;
//   2. registration-to-visible latency: with 1,000 nodes heartbeating every 3 s in the background,
//      the time from send() of a brand-new node to the snapshot cell showing it;
//   3. CPU cost at scale: 10,000 nodes heartbeating every 3 s from a forked child; the parent runs
//      only the service (then, as the baseline, only a bare ROUTER), and getrusage(RUSAGE_SELF)
//      over a window gives its CPU time, split per thread from /proc/self/task.
// Method, machine and numbers: bench/discovery/RESULTS.md. `--smoke` runs tiny sizes (CTest) and
// fails on lost messages or timeouts; targets are reported, not enforced.
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include "proto/base/log.h"
#include <zmq.hpp>

#include "discovery/discovery_counters.h"
#include "discovery/discovery_service.h"
#include "proto/base/snapshot_cell.h"
#include "proto/discovery_message.h"

namespace {

using pdr::discovery::DiscoveryCounters;
using pdr::discovery::DiscoveryService;
using pdr::discovery::DiscoveryServiceOptions;
using pdr::discovery::RegistrySnapshot;
using pdr::SnapshotCell;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kSendTimeoutMs = 10000;  // a sender never blocks longer than this on a dead receiver
constexpr double kTargetMsgsPerSec = 100000.0;
constexpr double kTargetCpuPercent = 5.0;

struct Config {
  bool smoke = false;
  std::string json_path;
  std::string only;  // "" = all phases; else "throughput", "latency" or "cpu" (for profiling)
  // 1. throughput
  int senders = 2;
  int sockets_per_sender = 4;
  uint64_t messages = 500000;
  uint32_t throughput_nodes = 10000;  // distinct addresses the messages cycle through
  seconds throughput_deadline{120};
  // 2. latency
  uint32_t latency_background_nodes = 1000;
  int latency_samples = 500;
  // 3. CPU
  uint32_t cpu_nodes = 10000;
  uint32_t cpu_nodes_per_socket = 20;
  milliseconds cpu_window{10000};
  // shared
  milliseconds heartbeat_period{3000};
  seconds warmup_deadline{60};
};

Config smoke_config() {
  Config c;
  c.smoke = true;
  c.messages = 20000;
  c.throughput_nodes = 1000;
  c.throughput_deadline = seconds(30);
  c.latency_background_nodes = 200;
  c.latency_samples = 50;
  c.cpu_nodes = 1000;
  c.cpu_window = milliseconds(2000);
  c.warmup_deadline = seconds(20);
  return c;
}

// ---- small helpers --------------------------------------------------------------------------

// Node n -> "127.a.b.c:8000" (loopback: the listener admits this machine only, and a node may register only its own address), a MoRIIO-current registration (what vLLM's MoRIIO proxy receives).
std::string node_ip(uint32_t node) {
  return fmt::format("127.{}.{}.{}", (node >> 16) & 255, (node >> 8) & 255, node & 255);
}
std::string node_key(uint32_t node) { return node_ip(node) + ":8000"; }

std::string encode_node(uint32_t node) {
  pdr::proto::Registration reg;
  reg.format = pdr::proto::RegistrationFormat::kMoriio;
  reg.role = node % 2 == 0 ? pdr::proto::Role::kPrefill : pdr::proto::Role::kDecode;
  reg.http_address = {node_ip(node), 8000};
  reg.moriio_zmq = pdr::proto::MoriioZmqAddress{node_ip(node), 6301, 61005};
  reg.zmq_address = reg.moriio_zmq->to_string();
  reg.dp_size = 1;
  reg.tp_size = 8;
  reg.transfer_mode = pdr::proto::TransferMode::kRead;
  return pdr::proto::encode_registration(reg);
}

std::vector<std::string> encode_nodes(uint32_t first, uint32_t count) {
  std::vector<std::string> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) out.push_back(encode_node(first + i));
  return out;
}

zmq::socket_t connect_dealer(zmq::context_t& ctx, const std::string& endpoint) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::sndtimeo, kSendTimeoutMs);
  s.connect(endpoint);
  return s;
}

bool send_payload(zmq::socket_t& s, const std::string& payload) {
  try {
    return s.send(zmq::buffer(payload), zmq::send_flags::none).has_value();
  } catch (const zmq::error_t&) {
    return false;
  }
}

uint64_t accepted_total(const DiscoveryCounters& c) {
  uint64_t sum = 0;
  for (const auto& a : c.accepted_by_format) sum += a.load(std::memory_order_relaxed);
  return sum;
}

// Polls `done` every millisecond until it holds or `deadline` passes.
bool wait_until(const std::function<bool()>& done, SteadyClock::time_point deadline) {
  while (!done()) {
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

double seconds_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

DiscoveryServiceOptions service_options() {
  DiscoveryServiceOptions o;
  o.bind_endpoint = "tcp://127.0.0.1:0";
  o.registry.max_instances = 1u << 20;  // the default (4096) is below the 10k-node scenario
  o.registry.max_per_class.fill(1u << 20);
  return o;
}

// ---- report ---------------------------------------------------------------------------------

struct Report {
  struct Row {
    std::string measurement, value, baseline, verdict;
  };
  std::vector<Row> rows;
  std::vector<std::pair<std::string, double>> numbers;  // for --json
  std::vector<std::string> failures;

  void row(std::string m, std::string v, std::string b, std::string verdict) {
    rows.push_back({std::move(m), std::move(v), std::move(b), std::move(verdict)});
  }
  void number(std::string key, double value) { numbers.emplace_back(std::move(key), value); }
  void fail(std::string why) {
    std::fprintf(stderr, "listener_bench: FAILED: %s\n", why.c_str());
    failures.push_back(std::move(why));
  }
};

std::string with_commas(double v) {
  std::string digits = fmt::format("{:.0f}", v);
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    out += digits[i];
    if ((n - i - 1) % 3 == 0 && i + 1 < n && digits[i] != '-') out += ',';
  }
  return out;
}

// ---- 1. throughput --------------------------------------------------------------------------

// A ZMQ ROUTER that only receives [identity, payload] and counts: the ceiling for the service.
// Same socket options and drain pattern (poll, then up to 4096 non-blocking receives).
class BareRouter {
 public:
  bool start() {
    try {
      router_ = zmq::socket_t(ctx_, zmq::socket_type::router);
      router_.set(zmq::sockopt::linger, 0);
      router_.set(zmq::sockopt::maxmsgsize, int64_t{1024 * 1024});
      router_.bind("tcp://127.0.0.1:*");
      endpoint_ = router_.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      std::fprintf(stderr, "bare router: %s\n", e.what());
      return false;
    }
    running_ = true;
    thread_ = std::thread([this] { loop(); });
    return true;
  }
  void stop() {
    running_ = false;
    if (thread_.joinable()) thread_.join();
    router_.close();
  }
  ~BareRouter() { stop(); }
  const std::string& endpoint() const { return endpoint_; }
  uint64_t received() const { return received_.load(std::memory_order_relaxed); }
  uint64_t registered() const { return received(); }  // every frame counts as a node coming up

 private:
  void loop() {
    zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
    while (running_.load(std::memory_order_relaxed)) {
      zmq::poll(&item, 1, milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      for (int i = 0; i < 4096; ++i) {
        zmq::message_t identity, payload;
        if (!router_.recv(identity, zmq::recv_flags::dontwait)) break;
        (void)router_.recv(payload, zmq::recv_flags::dontwait);
        received_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  zmq::context_t ctx_{1};
  zmq::socket_t router_;
  std::string endpoint_;
  std::atomic<bool> running_{false};
  std::atomic<uint64_t> received_{0};
  std::thread thread_;
};

struct BlastResult {
  bool ok = false;
  double seconds = 0;
  double msgs_per_sec = 0;
};

// Sends config.messages payloads (message i carries payloads[i % size]) from config.senders
// threads, each with its own context and sockets, and times until `received()` reaches the total.
BlastResult blast(const Config& config, const std::string& endpoint,
                  const std::vector<std::string>& payloads, const std::function<uint64_t()>& received,
                  const char* label, Report& report) {
  const uint64_t total = config.messages;
  const int k = config.senders;
  std::latch ready(k + 1);
  std::latch go(1);
  std::latch finished(1);  // sockets stay open until then: closing with linger 0 drops queued messages
  std::atomic<int> send_failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < k; ++t) {
    threads.emplace_back([&, t] {
      zmq::context_t ctx(1);
      std::vector<zmq::socket_t> sockets;
      for (int s = 0; s < config.sockets_per_sender; ++s) sockets.push_back(connect_dealer(ctx, endpoint));
      ready.count_down();
      go.wait();
      size_t next_socket = 0;
      for (uint64_t i = static_cast<uint64_t>(t); i < total; i += static_cast<uint64_t>(k)) {
        if (!send_payload(sockets[next_socket], payloads[i % payloads.size()])) {
          send_failures.fetch_add(1);
          break;
        }
        next_socket = (next_socket + 1) % sockets.size();
      }
      finished.wait();
    });
  }
  ready.arrive_and_wait();
  const auto start = SteadyClock::now();
  go.count_down();
  const bool done = wait_until([&] { return received() >= total; }, start + config.throughput_deadline);
  const auto end = SteadyClock::now();
  finished.count_down();
  for (auto& th : threads) th.join();

  BlastResult r;
  r.seconds = seconds_between(start, end);
  r.msgs_per_sec = static_cast<double>(received()) / r.seconds;
  if (send_failures.load() > 0) report.fail(fmt::format("{}: {} sender(s) hit a send timeout", label, send_failures.load()));
  if (!done) {
    report.fail(fmt::format("{}: only {} of {} messages arrived within {} s", label, received(), total,
                            config.throughput_deadline.count()));
    return r;
  }
  r.ok = send_failures.load() == 0;
  return r;
}

void measure_throughput(const Config& config, Report& report) {
  const std::vector<std::string> payloads = encode_nodes(0, config.throughput_nodes);

  BlastResult baseline;
  {
    BareRouter router;
    if (!router.start()) {
      report.fail("bare router: cannot bind");
      return;
    }
    baseline = blast(config, router.endpoint(), payloads, [&] { return router.received(); }, "bare ROUTER", report);
    router.stop();
    if (baseline.ok && router.received() != config.messages) {
      report.fail(fmt::format("bare ROUTER: received {} of {}", router.received(), config.messages));
    }
  }

  SnapshotCell<RegistrySnapshot> cell;
  DiscoveryCounters counters;
  DiscoveryService service(cell, counters);
  if (auto st = service.start(service_options()); !st) {
    report.fail("DiscoveryService: " + st.to_string());
    return;
  }
  const BlastResult measured = blast(
      config, service.bound_endpoint(), payloads,
      [&] { return counters.frames_received.load(std::memory_order_relaxed); }, "DiscoveryService", report);
  service.stop();

  const uint64_t frames = counters.frames_received.load();
  const uint64_t accepted = accepted_total(counters);
  const uint64_t rejected = counters.rejected_total();
  const uint64_t added = counters.added.load();
  if (measured.ok && (frames != config.messages || accepted != config.messages || rejected != 0)) {
    report.fail(fmt::format("DiscoveryService: {} frames, {} accepted, {} rejected; expected {} accepted",
                            frames, accepted, rejected, config.messages));
  }
  if (measured.ok && added != std::min<uint64_t>(config.throughput_nodes, config.messages)) {
    report.fail(fmt::format("DiscoveryService: {} instances added, expected {}", added,
                            std::min<uint64_t>(config.throughput_nodes, config.messages)));
  }
  const auto published = cell.load();
  if (measured.ok && published->instances.size() != added) {
    report.fail(fmt::format("DiscoveryService: last snapshot holds {} instances, expected {}",
                            published->instances.size(), added));
  }

  const double ratio = baseline.msgs_per_sec > 0 ? measured.msgs_per_sec / baseline.msgs_per_sec : 0;
  report.row(fmt::format("throughput: {} msgs, {} addresses, {} sender threads x {} DEALER", with_commas(static_cast<double>(config.messages)),
                         with_commas(config.throughput_nodes), config.senders, config.sockets_per_sender),
             with_commas(measured.msgs_per_sec) + " msg/s",
             with_commas(baseline.msgs_per_sec) + " msg/s (bare ROUTER)",
             fmt::format("{:.2f} of baseline; target >= 100,000: {}", ratio,
                         measured.msgs_per_sec >= kTargetMsgsPerSec ? "met" : "MISSED"));
  report.row("  accounted: frames / accepted / rejected / snapshots",
             fmt::format("{} / {} / {} / {}", frames, accepted, rejected, counters.snapshots_published.load()), "-", "-");
  report.number("throughput_msgs_per_sec", measured.msgs_per_sec);
  report.number("throughput_baseline_msgs_per_sec", baseline.msgs_per_sec);
  report.number("throughput_ratio", ratio);
  report.number("throughput_snapshots_published", static_cast<double>(counters.snapshots_published.load()));
}

// ---- heartbeating nodes (latency background and the CPU child) --------------------------------

// Sends one registration per node at once (the nodes come up), then one per node every `period`,
// spread evenly over the period (node j at offset j * period / nodes). `wait` sleeps until the
// given time and returns false when the heartbeats should stop. Returns false on a send failure.
bool run_heartbeats(const std::string& endpoint, uint32_t first_node, uint32_t nodes, uint32_t nodes_per_socket,
                    milliseconds period, const std::function<bool(SteadyClock::time_point)>& wait) {
  const std::vector<std::string> payloads = encode_nodes(first_node, nodes);
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> sockets;
  for (uint32_t s = 0; s < (nodes + nodes_per_socket - 1) / nodes_per_socket; ++s) {
    sockets.push_back(connect_dealer(ctx, endpoint));
  }
  auto socket_for = [&](uint32_t node) -> zmq::socket_t& { return sockets[node / nodes_per_socket]; };
  for (uint32_t j = 0; j < nodes; ++j) {
    if (!send_payload(socket_for(j), payloads[j])) return false;
  }
  const auto t0 = SteadyClock::now();
  const int64_t period_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(period).count();
  auto due = [&](uint64_t seq) {
    return t0 + std::chrono::nanoseconds(period_ns * static_cast<int64_t>(seq / nodes) +
                                         period_ns * static_cast<int64_t>(seq % nodes) / nodes);
  };
  // The steady schedule starts right after the start-up round, so the rate is even from t0 on.
  uint64_t seq = 0;
  for (;;) {
    if (!wait(due(seq))) return true;
    const auto now = SteadyClock::now();
    while (due(seq) <= now) {
      const auto node = static_cast<uint32_t>(seq % nodes);
      if (!send_payload(socket_for(node), payloads[node])) return false;
      ++seq;
    }
  }
}

// A background thread running run_heartbeats until stop().
class HeartbeatThread {
 public:
  HeartbeatThread(std::string endpoint, uint32_t first_node, uint32_t nodes, milliseconds period) {
    thread_ = std::thread([this, endpoint = std::move(endpoint), first_node, nodes, period] {
      ok_ = run_heartbeats(endpoint, first_node, nodes, 20, period, [this](SteadyClock::time_point until) {
        std::unique_lock lock(mutex_);
        return !cv_.wait_until(lock, until, [this] { return stop_; });
      });
    });
  }
  ~HeartbeatThread() { stop(); }
  bool stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    return ok_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<bool> ok_{true};
  std::thread thread_;
};

// ---- 2. registration-to-visible latency ----------------------------------------------------

void measure_latency(const Config& config, Report& report) {
  constexpr uint32_t kBackgroundFirst = 100000;
  constexpr uint32_t kProbeFirst = 200000;
  SnapshotCell<RegistrySnapshot> cell;
  DiscoveryCounters counters;
  DiscoveryService service(cell, counters);
  if (auto st = service.start(service_options()); !st) {
    report.fail("DiscoveryService: " + st.to_string());
    return;
  }
  const std::string endpoint = service.bound_endpoint();
  HeartbeatThread background(endpoint, kBackgroundFirst, config.latency_background_nodes, config.heartbeat_period);
  if (!wait_until([&] { return counters.added.load() >= config.latency_background_nodes; },
                  SteadyClock::now() + config.warmup_deadline)) {
    report.fail(fmt::format("latency: only {} of {} background nodes registered within {} s", counters.added.load(),
                            config.latency_background_nodes, config.warmup_deadline.count()));
    background.stop();
    service.stop();
    return;
  }

  const int samples = config.latency_samples;
  std::vector<std::string> payloads = encode_nodes(kProbeFirst, static_cast<uint32_t>(samples) + 1);
  zmq::context_t ctx(1);
  zmq::socket_t probe = connect_dealer(ctx, endpoint);
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> gap_us(2000, 8000);  // decorrelate from the 2 ms wake-up coalescing
  std::vector<double> latencies_us;
  // Sample 0 warms the probe connection (TCP + ZMTP handshake) and is not recorded.
  for (int i = 0; i <= samples; ++i) {
    const std::string key = node_key(kProbeFirst + static_cast<uint32_t>(i));
    std::this_thread::sleep_for(std::chrono::microseconds(gap_us(rng)));
    uint64_t seen = cell.version();
    const auto sent = SteadyClock::now();
    if (!send_payload(probe, payloads[static_cast<size_t>(i)])) {
      report.fail("latency: probe send failed");
      break;
    }
    const auto deadline = sent + seconds(2);
    bool visible = false;
    for (;;) {
      const uint64_t v = cell.version();
      if (v != seen) {
        seen = v;
        if (cell.load()->find(key) != nullptr) {
          visible = true;
          break;
        }
      }
      if (SteadyClock::now() >= deadline) break;
      std::this_thread::yield();  // 2 cores: let the discovery and I/O threads run
    }
    const auto seen_at = SteadyClock::now();
    if (!visible) {
      report.fail(fmt::format("latency: {} not visible within 2 s", key));
      break;
    }
    if (i > 0) latencies_us.push_back(std::chrono::duration<double, std::micro>(seen_at - sent).count());
  }
  probe.close();
  if (!background.stop()) report.fail("latency: background heartbeat send failed");
  service.stop();
  if (counters.rejected_total() != 0) report.fail(fmt::format("latency: {} messages rejected", counters.rejected_total()));
  if (latencies_us.size() != static_cast<size_t>(samples)) return;

  std::sort(latencies_us.begin(), latencies_us.end());
  auto pct = [&](double p) {
    const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(latencies_us.size())));
    return latencies_us[std::max<size_t>(rank, 1) - 1];
  };
  const double rate = static_cast<double>(config.latency_background_nodes) * 1000.0 /
                      static_cast<double>(config.heartbeat_period.count());
  const std::string setup = fmt::format("{} nodes @ {} s (~{:.0f} msg/s), {} samples", with_commas(config.latency_background_nodes),
                                        config.heartbeat_period.count() / 1000.0, rate, samples);
  report.row("register-to-visible p50: " + setup, fmt::format("{:.0f} us", pct(0.50)), "-", "-");
  report.row("register-to-visible p99", fmt::format("{:.0f} us", pct(0.99)), "-", "-");
  report.row("register-to-visible max", fmt::format("{:.0f} us", latencies_us.back()), "-", "-");
  report.number("latency_p50_us", pct(0.50));
  report.number("latency_p99_us", pct(0.99));
  report.number("latency_max_us", latencies_us.back());
}

// ---- 3. CPU cost at scale -------------------------------------------------------------------

// Child side: reads the endpoint line from `control_fd`, heartbeats until the parent closes it.
[[noreturn]] void heartbeat_child(int control_fd, const Config& config, uint32_t first_node) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::string endpoint;
  pollfd pfd{control_fd, POLLIN, 0};
  const auto deadline = SteadyClock::now() + seconds(30);
  while (endpoint.empty() || endpoint.back() != '\n') {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - SteadyClock::now()).count();
    if (left <= 0 || ::poll(&pfd, 1, static_cast<int>(left)) <= 0) ::_exit(3);
    char buf[256];
    const ssize_t n = ::read(control_fd, buf, sizeof buf);
    if (n <= 0) ::_exit(3);
    endpoint.append(buf, static_cast<size_t>(n));
  }
  endpoint.pop_back();
  const bool ok = run_heartbeats(endpoint, first_node, config.cpu_nodes, config.cpu_nodes_per_socket,
                                 config.heartbeat_period, [control_fd](SteadyClock::time_point until) {
    const auto left = until - SteadyClock::now();
    timespec ts{0, 0};
    if (left > left.zero()) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      ts.tv_sec = static_cast<time_t>(ns / 1000000000);
      ts.tv_nsec = static_cast<long>(ns % 1000000000);
    }
    pollfd p{control_fd, POLLIN, 0};
    // Readable means EOF (or stray data): the parent wants us to stop.
    return ::ppoll(&p, 1, &ts, nullptr) == 0;
  });
  ::_exit(ok ? 0 : 4);
}

double cpu_seconds(const rusage& r) {
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

// Waits for the child to exit (deadline 10 s, then SIGKILL). Returns its exit code, -1 if killed.
int reap_child(pid_t pid) {
  const auto deadline = SteadyClock::now() + seconds(10);
  int status = 0;
  for (;;) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return -1;
    if (SteadyClock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// CPU time of this process's threads, split by role: ZMQ's background threads are named
// "ZMQbg/..."; the main thread only sleeps; any other thread is the receiver loop under test.
struct ThreadCpu {
  double receiver = 0, zmq_io = 0, main = 0;
};

ThreadCpu thread_cpu() {
  ThreadCpu out;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const std::string self = std::to_string(::getpid());
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(entry.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    const auto open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    const std::string comm = stat.substr(open + 1, close - open - 1);
    std::istringstream rest(stat.substr(close + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {  // fields 14 and 15: utime, stime (ticks)
      if (i == 14) utime = std::strtod(field.c_str(), nullptr);
      if (i == 15) stime = std::strtod(field.c_str(), nullptr);
    }
    const double secs = (utime + stime) / tick;
    if (entry.path().filename() == self) {
      out.main += secs;
    } else if (comm.rfind("ZMQbg", 0) == 0) {
      out.zmq_io += secs;
    } else {
      out.receiver += secs;
    }
  }
  return out;
}

// Wraps DiscoveryService with the interface measure_cpu_of() wants (BareRouter has it too).
class ServiceUnderTest {
 public:
  ServiceUnderTest() : service_(cell_, counters_) {}
  bool start() {
    const pdr::Status st = service_.start(service_options());
    if (!st) std::fprintf(stderr, "DiscoveryService: %s\n", st.to_string().c_str());
    return st.is_ok();
  }
  std::string endpoint() const { return service_.bound_endpoint(); }
  uint64_t received() const { return counters_.frames_received.load(std::memory_order_relaxed); }
  uint64_t registered() const { return counters_.added.load(std::memory_order_relaxed); }
  void stop() { service_.stop(); }
  const DiscoveryCounters& counters() const { return counters_; }

 private:
  SnapshotCell<RegistrySnapshot> cell_;
  DiscoveryCounters counters_;
  DiscoveryService service_;
};

struct CpuSample {
  double wall = 0, cpu = 0, msgs_per_sec = 0;
  uint64_t frames = 0;
  ThreadCpu threads;
  double percent() const { return 100.0 * cpu / wall; }
  double us_per_msg() const { return frames > 0 ? cpu * 1e6 / static_cast<double>(frames) : 0.0; }
};

// Forks a child that heartbeats config.cpu_nodes nodes, starts `receiver` in this process, waits
// until every node registered, lets the start-up burst drain, then measures this process's CPU
// time (getrusage RUSAGE_SELF: the receiver's threads plus an idle main thread) over the window.
template <typename Receiver>
std::optional<CpuSample> measure_cpu_of(Receiver& receiver, const char* label, const Config& config,
                                        Report& report) {
  constexpr uint32_t kFirst = 300000;
  int control[2];
  if (::pipe(control) != 0) {
    report.fail(fmt::format("cpu ({}): pipe: {}", label, std::strerror(errno)));
    return std::nullopt;
  }
  // Fork while this process is single-threaded (everything before has been joined); the child
  // makes its own ZMQ context and never touches the parent's.
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) {
    report.fail(fmt::format("cpu ({}): fork: {}", label, std::strerror(errno)));
    ::close(control[0]);
    ::close(control[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    ::close(control[1]);
    heartbeat_child(control[0], config, kFirst);
  }
  ::close(control[0]);
  int control_fd = control[1];
  auto stop_all = [&] {
    if (control_fd >= 0) ::close(control_fd);
    control_fd = -1;
    const int status = reap_child(pid);
    receiver.stop();
    return status;
  };

  if (!receiver.start()) {
    report.fail(fmt::format("cpu ({}): receiver did not start", label));
    stop_all();
    return std::nullopt;
  }
  const std::string line = receiver.endpoint() + "\n";
  if (::write(control_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    report.fail(fmt::format("cpu ({}): cannot hand the endpoint to the child", label));
    stop_all();
    return std::nullopt;
  }
  if (!wait_until([&] { return receiver.registered() >= config.cpu_nodes; },
                  SteadyClock::now() + config.warmup_deadline)) {
    report.fail(fmt::format("cpu ({}): only {} of {} nodes registered within {} s", label, receiver.registered(),
                            config.cpu_nodes, config.warmup_deadline.count()));
    stop_all();
    return std::nullopt;
  }
  // Let the start-up burst (every node registering at once) drain before measuring steady state.
  std::this_thread::sleep_for(milliseconds(config.smoke ? 300 : 1000));

  rusage before{}, after{};
  const uint64_t frames0 = receiver.received();
  const ThreadCpu threads0 = thread_cpu();
  ::getrusage(RUSAGE_SELF, &before);
  const auto t0 = SteadyClock::now();
  std::this_thread::sleep_for(config.cpu_window);
  ::getrusage(RUSAGE_SELF, &after);
  const auto t1 = SteadyClock::now();
  const ThreadCpu threads1 = thread_cpu();
  CpuSample s;
  s.frames = receiver.received() - frames0;
  s.wall = seconds_between(t0, t1);
  s.cpu = cpu_seconds(after) - cpu_seconds(before);
  s.msgs_per_sec = static_cast<double>(s.frames) / s.wall;
  s.threads = {threads1.receiver - threads0.receiver, threads1.zmq_io - threads0.zmq_io, threads1.main - threads0.main};

  const int child_status = stop_all();
  if (child_status != 0) report.fail(fmt::format("cpu ({}): heartbeat child exited with {}", label, child_status));
  const double expected_rate =
      static_cast<double>(config.cpu_nodes) * 1000.0 / static_cast<double>(config.heartbeat_period.count());
  // The child catches up on missed slots, so only a starved child or lost messages move the rate;
  // smoke runs share CI machines and get a wider band.
  const double tolerance = config.smoke ? 0.5 : 0.2;
  if (s.msgs_per_sec < (1 - tolerance) * expected_rate || s.msgs_per_sec > (1 + tolerance) * expected_rate) {
    report.fail(fmt::format("cpu ({}): {:.0f} msg/s arrived during the window, expected ~{:.0f}", label,
                            s.msgs_per_sec, expected_rate));
  }
  return s;
}

void measure_cpu(const Config& config, Report& report) {
  std::optional<CpuSample> bare;
  {
    BareRouter router;
    bare = measure_cpu_of(router, "bare ROUTER", config, report);
  }
  ServiceUnderTest service;
  const std::optional<CpuSample> measured = measure_cpu_of(service, "DiscoveryService", config, report);
  const DiscoveryCounters& counters = service.counters();
  if (counters.rejected_total() != 0) report.fail(fmt::format("cpu: {} messages rejected", counters.rejected_total()));
  if (counters.expiries.load() != 0) report.fail(fmt::format("cpu: {} nodes expired", counters.expiries.load()));
  if (!measured || !bare) return;

  const double percent = measured->percent();
  report.row(fmt::format("CPU: {} nodes @ {} s heartbeat, {} DEALER, {:.1f} s window", with_commas(config.cpu_nodes),
                         config.heartbeat_period.count() / 1000.0,
                         (config.cpu_nodes + config.cpu_nodes_per_socket - 1) / config.cpu_nodes_per_socket,
                         measured->wall),
             fmt::format("{:.2f} % of one core", percent),
             fmt::format("{:.2f} % (bare ROUTER)", bare->percent()),
             fmt::format("{:.1f}x baseline; target < 5 %: {}", percent / std::max(bare->percent(), 1e-9),
                         percent < kTargetCpuPercent ? "met" : "MISSED"));
  report.row("  CPU per message", fmt::format("{:.1f} us", measured->us_per_msg()),
             fmt::format("{:.1f} us", bare->us_per_msg()), "-");
  report.row("  split: receiver thread / ZMQ I/O thread / main",
             fmt::format("{:.2f} / {:.2f} / {:.2f} s", measured->threads.receiver, measured->threads.zmq_io,
                         measured->threads.main),
             fmt::format("{:.2f} / {:.2f} / {:.2f} s", bare->threads.receiver, bare->threads.zmq_io,
                         bare->threads.main),
             "-");
  report.row("  msgs/s received during the window", fmt::format("{:.0f} msg/s", measured->msgs_per_sec),
             fmt::format("{:.0f} msg/s", bare->msgs_per_sec),
             fmt::format("{:.0f} expected", static_cast<double>(config.cpu_nodes) * 1000.0 /
                                                static_cast<double>(config.heartbeat_period.count())));
  report.number("cpu_percent_one_core", percent);
  report.number("cpu_baseline_percent_one_core", bare->percent());
  report.number("cpu_us_per_msg", measured->us_per_msg());
  report.number("cpu_baseline_us_per_msg", bare->us_per_msg());
  report.number("cpu_discovery_thread_seconds", measured->threads.receiver);
  report.number("cpu_zmq_io_thread_seconds", measured->threads.zmq_io);
  report.number("cpu_msgs_per_sec", measured->msgs_per_sec);
  report.number("cpu_snapshots_published", static_cast<double>(counters.snapshots_published.load()));
}

// ---- machine and output ---------------------------------------------------------------------

struct Machine {
  long nproc = 0;
  std::string cpu_model = "unknown";
  std::string kernel = "unknown";
  std::string build;
};

Machine describe_machine() {
  Machine m;
  m.nproc = ::sysconf(_SC_NPROCESSORS_ONLN);
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) m.cpu_model = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  }
  utsname u{};
  if (::uname(&u) == 0) m.kernel = fmt::format("{} {} {}", u.sysname, u.release, u.machine);
#if defined(__OPTIMIZE__) && defined(NDEBUG)
  m.build = "optimized, NDEBUG";
#elif defined(__OPTIMIZE__)
  m.build = "optimized, assertions on";
#else
  m.build = "UNOPTIMIZED (numbers not representative)";
#endif
  return m;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

bool write_json(const std::string& path, const Machine& m, const Config& c, const Report& r) {
  std::ofstream out(path);
  if (!out) return false;
  out << "{\n  \"machine\": {\"nproc\": " << m.nproc << ", \"cpu_model\": \"" << json_escape(m.cpu_model)
      << "\", \"kernel\": \"" << json_escape(m.kernel) << "\", \"build\": \"" << json_escape(m.build) << "\"},\n";
  out << "  \"smoke\": " << (c.smoke ? "true" : "false") << ",\n  \"results\": {";
  for (size_t i = 0; i < r.numbers.size(); ++i) {
    out << (i ? ",\n    " : "\n    ") << '"' << r.numbers[i].first << "\": " << fmt::format("{:.3f}", r.numbers[i].second);
  }
  out << "\n  },\n  \"failures\": [";
  for (size_t i = 0; i < r.failures.size(); ++i) out << (i ? ", " : "") << '"' << json_escape(r.failures[i]) << '"';
  out << "]\n}\n";
  return static_cast<bool>(out);
}

void print_table(const Report& r) {
  std::printf("| measurement | value | baseline | ratio/target |\n| --- | --- | --- | --- |\n");
  for (const auto& row : r.rows) {
    std::printf("| %s | %s | %s | %s |\n", row.measurement.c_str(), row.value.c_str(), row.baseline.c_str(),
                row.verdict.c_str());
  }
}

void raise_fd_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &lim);
  }
}

int usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s [--smoke] [--json FILE] [--only throughput|latency|cpu]\n"
               "       [--senders K] [--messages M]\n", argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool smoke = false;
  for (int i = 1; i < argc; ++i) smoke = smoke || std::string(argv[i]) == "--smoke";
  Config config = smoke ? smoke_config() : Config{};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--smoke") continue;
    if (arg == "--json" && i + 1 < argc) {
      config.json_path = argv[++i];
    } else if (arg == "--only" && i + 1 < argc) {
      config.only = argv[++i];
      if (config.only != "throughput" && config.only != "latency" && config.only != "cpu") return usage(argv[0]);
    } else if (arg == "--senders" && i + 1 < argc) {
      config.senders = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--messages" && i + 1 < argc) {
      config.messages = std::max<uint64_t>(1, std::strtoull(argv[++i], nullptr, 10));
    } else {
      return usage(argv[0]);
    }
  }

  pdr::log::set_level(pdr::log::Level::kWarn);  // one info line per new node would swamp the table
  raise_fd_limit();
  const Machine machine = describe_machine();
  std::printf("listener_bench%s: nproc %ld, CPU %s, kernel %s, build %s\n", config.smoke ? " (smoke)" : "",
              machine.nproc, machine.cpu_model.c_str(), machine.kernel.c_str(), machine.build.c_str());
  std::printf("\n");

  Report report;
  auto wanted = [&](const char* phase) { return config.only.empty() || config.only == phase; };
  if (wanted("throughput")) measure_throughput(config, report);
  if (wanted("latency")) measure_latency(config, report);
  if (wanted("cpu")) measure_cpu(config, report);  // last: it forks, which wants no other threads alive
  print_table(report);

  if (!config.json_path.empty() && !write_json(config.json_path, machine, config, report)) {
    report.fail("cannot write " + config.json_path);
  }
  if (!report.failures.empty()) {
    std::printf("\nFAILED: %zu check(s) failed (see stderr)\n", report.failures.size());
    return 1;
  }
  return 0;
}
