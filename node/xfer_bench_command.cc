#include "node/xfer_bench_command.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "node/xfer_bench_raw.h"
#include "transfer/backend_factory.h"
#include "transfer/engine.h"

namespace pdr::node {
namespace {

using namespace pdr::transfer;
using Seconds = std::chrono::duration<double>;
constexpr int kExitFailed = 1;
constexpr int kExitBadFlags = 2;
constexpr std::uint64_t kLatencyBytes = 64 * 1024;
constexpr std::uint64_t kBatchBytes = 8u << 20;

// "16K", "1M", "2G" or a plain byte count.
bool parse_size(const std::string& text, std::uint64_t* out) {
  if (text.empty()) return false;
  std::uint64_t unit = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': unit = 1ull << 10; digits.pop_back(); break;
    case 'M': case 'm': unit = 1ull << 20; digits.pop_back(); break;
    case 'G': case 'g': unit = 1ull << 30; digits.pop_back(); break;
    default: break;
  }
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoull(digits) * unit;
  return *out > 0;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string human_size(std::uint64_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// The target's pool content: a fixed function of the offset, so READs can be checked.
std::byte pattern(std::uint64_t offset) {
  return static_cast<std::byte>((offset * 2654435761u >> 13) & 0xff);
}

struct Plan {
  std::vector<BackendKind> backends;
  std::vector<std::uint32_t> lanes;
  std::vector<std::uint64_t> sizes;
  std::vector<XferOp> ops;
  std::uint64_t bytes_per_point = 0;
  std::uint64_t pool = 0;
  std::uint32_t latency_iterations = 0;
};

std::string build_plan(const XferBenchFlags& f, Plan* plan) {
  if (Status s = parse_backend_list(f.backends, &plan->backends); !s) {
    return "--backends: " + s.message();
  }
  for (const std::string& item : split(f.lanes)) {
    std::uint64_t lanes = 0;
    if (!parse_size(item, &lanes) || lanes > 16) return "--lanes '" + item + "': expected 1..16";
    plan->lanes.push_back(static_cast<std::uint32_t>(lanes));
  }
  if (!parse_size(f.pool, &plan->pool)) return "--pool '" + f.pool + "' is not a size";
  for (const std::string& item : split(f.sizes)) {
    std::uint64_t size = 0;
    if (!parse_size(item, &size)) return "--sizes '" + item + "' is not a size";
    if (2 * size > plan->pool) return "--sizes " + item + " needs a --pool of at least twice that";
    plan->sizes.push_back(size);
  }
  for (const std::string& item : split(f.ops)) {
    if (item == "read") plan->ops.push_back(XferOp::kRead);
    else if (item == "write") plan->ops.push_back(XferOp::kWrite);
    else return "--ops '" + item + "': expected read or write";
  }
  if (!parse_size(f.bytes_per_point, &plan->bytes_per_point)) {
    return "--bytes-per-point '" + f.bytes_per_point + "' is not a size";
  }
  plan->latency_iterations = std::max<std::uint32_t>(f.latency_iterations, 1);
  if (f.smoke) {
    plan->bytes_per_point = std::min<std::uint64_t>(plan->bytes_per_point, 8u << 20);
    plan->latency_iterations = std::min<std::uint32_t>(plan->latency_iterations, 50);
  }
  if (plan->lanes.empty() || plan->sizes.empty() || plan->ops.empty()) {
    return "--lanes, --sizes and --ops must each name at least one value";
  }
  return "";
}

// Both sides define one layout per size, in order (ids 1..n): blocks of `size` with a one-block
// gap, so adjacent ids never coalesce and every block is its own operation.
Status make_pool(Engine& engine, const Plan& plan, std::byte** base, RegionId* region) {
  if (Status s = engine.allocate_region(plan.pool, region, base); !s) return s;
  for (std::uint64_t size : plan.sizes) {
    LayoutId id = 0;
    const auto count = static_cast<std::uint32_t>(plan.pool / (2 * size));
    if (Status s = engine.define_layout(
            {.region = *region, .block_bytes = size, .stride = 2 * size, .block_count = count},
            &id);
        !s) {
      return s;
    }
  }
  return Status::ok();
}

Status make_engine(const std::string& agent, std::vector<BackendKind> kinds, std::uint32_t lanes,
                   std::unique_ptr<Engine>* out) {
  BackendSettings settings;
  settings.tcp_lanes = lanes;
  std::vector<std::unique_ptr<Backend>> backends;
  if (Status s = make_backends(kinds, settings, &backends); !s) return s;
  return Engine::create({.agent = agent}, std::move(backends), out);
}

// ---- the target (--serve) ----

int run_target(const Plan& plan) {
  std::unique_ptr<Engine> engine;
  Status s = make_engine("xfer-bench-target-" + std::to_string(::getpid()), plan.backends, 0,
                         &engine);
  std::byte* base = nullptr;
  RegionId region = kInvalidRegion;
  if (s) s = make_pool(*engine, plan, &base, &region);
  xfer_bench::RawSink sink;
  if (s) s = sink.start();
  if (!s) {
    std::cerr << "xfer-bench target: " << s.to_string() << "\n";
    return kExitFailed;
  }
  for (std::uint64_t i = 0; i < plan.pool; ++i) base[i] = pattern(i);
  std::string hex;
  static const char* digits = "0123456789abcdef";
  for (unsigned char c : engine->export_local()) {
    hex += digits[c >> 4];
    hex += digits[c & 15];
  }
  std::cout << "raw_port " << sink.port() << "\ndescriptor " << hex << "\nready" << std::endl;
  // Serve until the initiator closes our stdin.
  char buffer[256];
  while (::read(STDIN_FILENO, buffer, sizeof buffer) > 0) {
  }
  return 0;
}

// ---- the initiator ----

struct Target {
  pid_t pid = -1;
  int stdin_fd = -1;
  std::uint16_t raw_port = 0;
  std::string descriptor;
  RegionId region = kInvalidRegion;  // the target's pool, from its descriptor

  ~Target() {
    if (stdin_fd >= 0) ::close(stdin_fd);
    if (pid > 0) ::waitpid(pid, nullptr, 0);
  }
};

Status start_target(const XferBenchFlags& f, Target* target) {
  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
    return Status(StatusCode::kIoError, std::string("pipe: ") + std::strerror(errno));
  }
  std::vector<std::string> args = {"pdnode",     "xfer-bench", "--serve", "--backends", f.backends,
                                   "--sizes",    f.sizes,      "--pool",  f.pool};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(to_child[0], STDIN_FILENO);
    ::dup2(from_child[1], STDOUT_FILENO);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (pid < 0) return Status(StatusCode::kIoError, std::string("fork: ") + std::strerror(errno));
  target->pid = pid;
  target->stdin_fd = to_child[1];
  FILE* out = ::fdopen(from_child[0], "r");
  char* line = nullptr;
  std::size_t capacity = 0;
  bool ready = false;
  while (!ready && ::getline(&line, &capacity, out) > 0) {
    std::string text(line);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    if (text.starts_with("raw_port ")) target->raw_port = static_cast<std::uint16_t>(std::stoul(text.substr(9)));
    if (text.starts_with("descriptor ")) {
      const std::string hex = text.substr(11);
      for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
        target->descriptor.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
      }
    }
    ready = text == "ready";
  }
  std::free(line);
  std::fclose(out);
  if (!ready) return Status(StatusCode::kIoError, "the target process did not start (see above)");
  proto::TransferDescriptor d;
  if (Status s = proto::decode_descriptor(
          std::as_bytes(std::span(target->descriptor.data(), target->descriptor.size())), {}, &d);
      !s) {
    return s;
  }
  if (d.regions.size() != 1) return Status(StatusCode::kMalformed, "the target has no single pool");
  target->region = d.regions[0].id;
  return Status::ok();
}

struct Point {
  std::string backend;
  std::uint32_t lanes = 0;
  std::string op;
  std::uint64_t block = 0;
  double gbps = 0;
};

struct Latency {
  std::string what;
  double p50_us = 0;
  double p99_us = 0;
};

Latency summarize(std::string what, std::vector<double> samples_us) {
  std::sort(samples_us.begin(), samples_us.end());
  auto at = [&](double q) {
    return samples_us[std::min(samples_us.size() - 1,
                               static_cast<std::size_t>(q * static_cast<double>(samples_us.size())))];
  };
  return {std::move(what), at(0.50), at(0.99)};
}

class Initiator {
 public:
  Initiator(const Plan& plan, const Target& target) : plan_(plan), target_(target) {}

  bool failed() const { return failed_; }
  const std::vector<Point>& points() const { return points_; }
  const std::vector<Latency>& latencies() const { return latencies_; }
  const std::vector<std::pair<std::uint64_t, std::pair<double, double>>>& ceilings() const {
    return ceilings_;
  }

  void measure_ceilings() {
    xfer_bench::RawClient raw;
    if (Status s = raw.connect(target_.raw_port); !s) return fail("raw tcp: " + s.to_string());
    std::vector<std::byte> src(plan_.pool), dst(plan_.pool);
    std::memset(src.data(), 1, src.size());
    std::memset(dst.data(), 2, dst.size());
    for (std::uint64_t size : plan_.sizes) {
      // Best of three: a ceiling should not be lowered by one unlucky scheduling slice.
      double raw_gbps = 0;
      double memcpy_gbps = 0;
      for (int attempt = 0; attempt < 3; ++attempt) {
        auto start = std::chrono::steady_clock::now();
        if (Status s = raw.send_message(plan_.bytes_per_point, size); !s) {
          return fail("raw tcp: " + s.to_string());
        }
        raw_gbps = std::max(raw_gbps, gbps(plan_.bytes_per_point, start));
        // memcpy over the blocks the engine moves: the same gapped layout and the same batch of
        // ids over and over (so the same cache footprint).
        const std::uint64_t batch = batch_blocks(size);
        start = std::chrono::steady_clock::now();
        for (std::uint64_t moved = 0, i = 0; moved < plan_.bytes_per_point; moved += size, ++i) {
          const std::uint64_t offset = (i % batch) * 2 * size;
          std::memcpy(dst.data() + offset, src.data() + offset, size);
        }
        memcpy_gbps = std::max(memcpy_gbps, gbps(plan_.bytes_per_point, start));
      }
      ceilings_.push_back({size, {raw_gbps, memcpy_gbps}});
      std::cerr << "ceiling " << human_size(size) << ": raw tcp " << raw_gbps << " GB/s, memcpy "
                << memcpy_gbps << " GB/s\n";
    }
    std::vector<double> samples;
    for (std::uint32_t i = 0; i < plan_.latency_iterations; ++i) {
      const auto start = std::chrono::steady_clock::now();
      if (Status s = raw.send_message(kLatencyBytes, kLatencyBytes); !s) {
        return fail("raw tcp: " + s.to_string());
      }
      samples.push_back(micros(start));
    }
    latencies_.push_back(summarize("raw tcp round trip", std::move(samples)));
  }

  void measure_backend(BackendKind kind) {
    const bool tcp = kind == BackendKind::kTcp;
    for (std::uint32_t lanes : tcp ? plan_.lanes : std::vector<std::uint32_t>{0}) {
      std::unique_ptr<Engine> engine;
      const std::string label(backend_kind_label(kind));
      Status s = make_engine("xfer-bench-" + label + "-" + std::to_string(::getpid()), {kind},
                             lanes, &engine);
      std::byte* base = nullptr;
      RegionId region = kInvalidRegion;
      if (s) s = make_pool(*engine, plan_, &base, &region);
      PeerId peer = kInvalidPeer;
      if (s) s = engine->import_peer(target_.descriptor, &peer);
      if (!s) return fail(label + ": " + s.to_string());
      if (engine->peer_backend(peer) != label) {
        return fail(label + ": the target is reached through " +
                    std::string(engine->peer_backend(peer)) + ", not " + label);
      }
      for (XferOp op : plan_.ops) {
        for (std::size_t i = 0; i < plan_.sizes.size(); ++i) {
          throughput(*engine, peer, base, static_cast<LayoutId>(i + 1), plan_.sizes[i], op,
                     {label, lanes, std::string(xfer_op_label(op)), plan_.sizes[i], 0});
        }
        latency(*engine, peer, region, op,
                label + (tcp ? " " + std::to_string(lanes) + " lane" + (lanes > 1 ? "s" : "") : "") +
                    " " + std::string(xfer_op_label(op)));
      }
    }
  }

 private:
  static double gbps(std::uint64_t bytes, std::chrono::steady_clock::time_point start) {
    return static_cast<double>(bytes) / Seconds(std::chrono::steady_clock::now() - start).count() /
           1e9;
  }
  static double micros(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
        .count();
  }
  // Blocks per submit for one block size: about kBatchBytes, within the pool.
  std::uint64_t batch_blocks(std::uint64_t size) const {
    return std::clamp<std::uint64_t>(kBatchBytes / size, 1, plan_.pool / (2 * size));
  }

  void fail(const std::string& why) {
    std::cerr << "xfer-bench: " << why << "\n";
    failed_ = true;
  }

  void throughput(Engine& engine, PeerId peer, std::byte* base, LayoutId layout,
                  std::uint64_t size, XferOp op, Point point) {
    const std::uint64_t batch = batch_blocks(size);
    std::vector<std::uint32_t> ids(batch);
    for (std::uint32_t i = 0; i < batch; ++i) ids[i] = i;
    const std::uint64_t batches = std::max<std::uint64_t>(1, plan_.bytes_per_point / (batch * size));
    // READ lands in zeroed memory and is checked against the target's pattern; WRITE sends that
    // same pattern, so the target's pool keeps it for the READs of later points.
    if (op == XferOp::kRead) {
      std::memset(base, 0, plan_.pool);
    } else {
      for (std::uint64_t i = 0; i < plan_.pool; ++i) base[i] = pattern(i);
    }
    std::array<Completion, 2> done;
    const BlockXfer xfer{op, peer, layout, ids, layout, ids};
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t submitted = 0;
    std::uint64_t finished = 0;
    // Two batches in flight: one on the wire while the other completes.
    while (finished < batches) {
      while (submitted < batches && submitted - finished < done.size()) {
        Completion& c = done[submitted % done.size()];
        c.rearm();
        if (Status s = engine.submit(xfer, &c); !s) return fail("submit: " + s.to_string());
        ++submitted;
      }
      const XferResult r = done[finished % done.size()].wait_for(std::chrono::seconds(60));
      if (r.state != XferState::kDone) {
        return fail(point.backend + " " + point.op + " " + human_size(size) + ": " +
                    std::string(xfer_state_label(r.state)) + " (" +
                    std::string(xfer_cause_label(r.cause)) + ")");
      }
      ++finished;
    }
    point.gbps = gbps(batches * batch * size, start);
    if (op == XferOp::kRead) {
      for (std::uint64_t block : {std::uint64_t{0}, batch - 1}) {
        const std::uint64_t offset = block * 2 * size;
        for (std::uint64_t b = 0; b < size; b += 4093) {
          if (base[offset + b] != pattern(offset + b)) {
            return fail(point.backend + " read " + human_size(size) + ": wrong byte at offset " +
                        std::to_string(offset + b));
          }
        }
      }
    }
    std::cerr << point.backend << " lanes=" << point.lanes << " " << point.op << " "
              << human_size(size) << ": " << point.gbps << " GB/s\n";
    points_.push_back(std::move(point));
  }

  void latency(Engine& engine, PeerId peer, RegionId region, XferOp op, std::string what) {
    const RawSegment segment{region, 0, target_.region, 0, kLatencyBytes};
    std::vector<double> samples;
    Completion done;
    for (std::uint32_t i = 0; i < plan_.latency_iterations; ++i) {
      done.rearm();
      const auto start = std::chrono::steady_clock::now();
      if (Status s = engine.submit(RawXfer{op, peer, {&segment, 1}}, &done); !s) {
        return fail("submit: " + s.to_string());
      }
      if (done.wait_for(std::chrono::seconds(60)).state != XferState::kDone) {
        return fail(what + ": a 64 KiB transfer failed");
      }
      samples.push_back(micros(start));
    }
    latencies_.push_back(summarize(std::move(what), std::move(samples)));
  }

  const Plan& plan_;
  const Target& target_;
  bool failed_ = false;
  std::vector<Point> points_;
  std::vector<Latency> latencies_;
  std::vector<std::pair<std::uint64_t, std::pair<double, double>>> ceilings_;
};

void print_report(const Initiator& run, const XferBenchFlags& f) {
  std::map<std::uint64_t, std::pair<double, double>> ceiling(run.ceilings().begin(),
                                                             run.ceilings().end());
  std::printf("\nCeilings (same run, best of 3): raw loopback TCP, one blocking stream, sends of "
              "the block size into a receive buffer of that size; memcpy of the same blocks, one "
              "thread\n");
  std::printf("| block | raw TCP GB/s | memcpy GB/s |\n|---|---|---|\n");
  for (const auto& [size, c] : run.ceilings()) {
    std::printf("| %s | %.2f | %.2f |\n", human_size(size).c_str(), c.first, c.second);
  }
  std::printf("\nEngine, between two processes (blocks never adjacent, ~8 MiB batches, 2 in "
              "flight)\n");
  std::printf("| backend | lanes | op | block | GB/s | %% of raw TCP | %% of memcpy |\n"
              "|---|---|---|---|---|---|---|\n");
  for (const Point& p : run.points()) {
    const auto& c = ceiling[p.block];
    std::printf("| %s | %s | %s | %s | %.2f | %.0f%% | %.0f%% |\n", p.backend.c_str(),
                p.lanes == 0 ? "-" : std::to_string(p.lanes).c_str(), p.op.c_str(),
                human_size(p.block).c_str(), p.gbps, 100 * p.gbps / c.first,
                100 * p.gbps / c.second);
  }
  double raw_p50 = 0;
  for (const Latency& l : run.latencies()) {
    if (l.what == "raw tcp round trip") raw_p50 = l.p50_us;
  }
  std::printf("\n64 KiB latency (one transfer, submit to completion)\n");
  std::printf("| what | p50 us | p99 us | p50 / raw round trip |\n|---|---|---|---|\n");
  for (const Latency& l : run.latencies()) {
    std::printf("| %s | %.1f | %.1f | %.2fx |\n", l.what.c_str(), l.p50_us, l.p99_us,
                raw_p50 > 0 ? l.p50_us / raw_p50 : 0.0);
  }
  if (!f.json.empty()) {
    nlohmann::json out;
    for (const auto& [size, c] : run.ceilings()) {
      out["ceilings"].push_back({{"block", size}, {"raw_tcp_gbps", c.first},
                                 {"memcpy_gbps", c.second}});
    }
    for (const Point& p : run.points()) {
      out["points"].push_back({{"backend", p.backend}, {"lanes", p.lanes}, {"op", p.op},
                               {"block", p.block}, {"gbps", p.gbps}});
    }
    for (const Latency& l : run.latencies()) {
      out["latency_64k"].push_back({{"what", l.what}, {"p50_us", l.p50_us}, {"p99_us", l.p99_us}});
    }
    std::ofstream(f.json) << out.dump(2) << "\n";
  }
}

}  // namespace

CLI::App* add_xfer_bench_command(CLI::App& app, XferBenchFlags* f) {
  CLI::App* cmd = app.add_subcommand(
      "xfer-bench",
      "Measure the KV transfer engine between two processes (it starts the second itself) against "
      "raw loopback TCP and memcpy: throughput per backend, lanes, op and block size, and 64 KiB "
      "latency.");
  cmd->add_option("--backends", f->backends, "Backends to measure, e.g. tcp,shm")
      ->capture_default_str();
  cmd->add_option("--lanes", f->lanes, "tcp lane counts to measure")->capture_default_str();
  cmd->add_option("--sizes", f->sizes, "Block sizes (K, M suffixes)")->capture_default_str();
  cmd->add_option("--ops", f->ops, "read, write or both")->capture_default_str();
  cmd->add_option("--bytes-per-point", f->bytes_per_point, "Bytes moved per measurement")
      ->capture_default_str();
  cmd->add_option("--latency-iterations", f->latency_iterations, "64 KiB transfers timed")
      ->capture_default_str();
  cmd->add_option("--pool", f->pool, "KV pool bytes on each side")->capture_default_str();
  cmd->add_option("--json", f->json, "Also write the results as JSON to this file");
  cmd->add_flag("--smoke", f->smoke, "CI mode: at most 8 MiB per point, 50 latency samples");
  cmd->add_flag("--serve", f->serve, "Internal: run the target side (started by xfer-bench itself)");
  return cmd;
}

int run_xfer_bench_command(const XferBenchFlags& flags) {
  Plan plan;
  if (std::string error = build_plan(flags, &plan); !error.empty()) {
    std::cerr << "pdnode xfer-bench: " << error << "\n";
    return kExitBadFlags;
  }
  if (flags.serve) return run_target(plan);
  Target target;
  if (Status s = start_target(flags, &target); !s) {
    std::cerr << "pdnode xfer-bench: " << s.to_string() << "\n";
    return kExitFailed;
  }
  Initiator run(plan, target);
  run.measure_ceilings();
  for (BackendKind kind : plan.backends) run.measure_backend(kind);
  print_report(run, flags);
  return run.failed() ? kExitFailed : 0;
}

}  // namespace pdr::node
