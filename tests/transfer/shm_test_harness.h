// Test harness for the shm backend: one "side" (RegionTable + counters + backend + notification
// log), memfd/plain region helpers and XferTask builders finishing into a Completion.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/time_scale.h"
#include "transfer/backend.h"
#include "transfer/core/completion.h"
#include "transfer/shm/shm_backend.h"

namespace pdr::transfer::test {

using namespace std::chrono_literals;

inline std::uint64_t checksum(const std::byte* data, std::size_t n) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<std::uint8_t>(data[i])) * 1099511628211ull;
  return h;
}

inline void fill_random(std::byte* data, std::size_t n, std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const std::uint64_t v = rng();
    std::memcpy(data + i, &v, 8);
  }
  for (; i < n; ++i) data[i] = static_cast<std::byte>(rng());
}

// A memory region owned by the test: memfd-backed (shareable) or plain anonymous memory.
struct TestMemory {
  int fd = -1;
  std::byte* addr = nullptr;
  std::size_t length = 0;
  TestMemory() = default;
  TestMemory(const TestMemory&) = delete;
  TestMemory& operator=(const TestMemory&) = delete;
  ~TestMemory() {
    if (addr != nullptr) ::munmap(addr, length);
    if (fd >= 0) ::close(fd);
  }
};

inline std::unique_ptr<TestMemory> make_memory(std::size_t length, bool memfd) {
  auto mem = std::make_unique<TestMemory>();
  mem->length = length;
  if (memfd) {
    mem->fd = ::memfd_create("pdr-shm-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (mem->fd < 0 || ::ftruncate(mem->fd, static_cast<off_t>(length)) != 0) return nullptr;
    ::fcntl(mem->fd, F_ADD_SEALS, F_SEAL_SHRINK);
    void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, mem->fd, 0);
    if (p == MAP_FAILED) return nullptr;
    mem->addr = static_cast<std::byte*>(p);
  } else {
    void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    mem->addr = static_cast<std::byte*>(p);
  }
  return mem;
}

struct Side {
  std::string agent;
  RegionTable regions;
  EngineCounters counters;
  std::unique_ptr<Backend> backend;
  std::mutex mu;
  std::condition_variable cv;
  std::map<RegionId, int> fds;  // guarded by mu
  std::vector<std::pair<std::string, std::string>> notes;  // guarded by mu
  std::function<void(std::string_view, std::string_view)> hook;  // guarded by mu; runs first
  std::vector<std::unique_ptr<TestMemory>> memory;

  explicit Side(std::string name, ShmBackendOptions options = {}) : agent(std::move(name)) {
    backend = make_shm_backend(options);
  }
  ~Side() {
    if (backend) backend->stop();
  }

  Status start() {
    BackendContext context;
    context.agent = agent;
    context.regions = &regions;
    context.counters = &counters;
    context.on_notification = [this](std::string_view from, std::string_view message) {
      std::function<void(std::string_view, std::string_view)> run_first;
      {
        std::lock_guard lock(mu);
        run_first = hook;
      }
      if (run_first) run_first(from, message);
      std::lock_guard lock(mu);
      notes.emplace_back(std::string(from), std::string(message));
      cv.notify_all();
    };
    context.region_fd = [this](RegionId id) {
      std::lock_guard lock(mu);
      auto it = fds.find(id);
      return it == fds.end() ? -1 : it->second;
    };
    return backend->start(context);
  }

  // Registers a fresh region; returns its id and address.
  RegionId add_region(std::size_t length, bool memfd, std::byte** addr) {
    auto mem = make_memory(length, memfd);
    EXPECT_NE(mem, nullptr);
    RegionId id = kInvalidRegion;
    EXPECT_TRUE(regions.register_region(mem->addr, length,
                                        memfd ? MemKind::kHostShared : MemKind::kHostDram, &id));
    if (memfd) {
      std::lock_guard lock(mu);
      fds[id] = mem->fd;
    }
    EXPECT_TRUE(backend->on_region_registered(id, *regions.lookup(id)));
    *addr = mem->addr;
    memory.push_back(std::move(mem));
    return id;
  }

  void set_hook(std::function<void(std::string_view, std::string_view)> fn) {
    std::lock_guard lock(mu);
    hook = std::move(fn);
  }

  proto::TransferDescriptor descriptor() const {
    proto::TransferDescriptor d;
    d.agent = agent;
    d.hostname = "host-1";
    d.boot_id = "boot-1";
    d.endpoints.push_back({proto::EndpointBackend::kShm, backend->local_address()});
    return d;
  }

  bool wait_note(std::string_view message, std::chrono::microseconds timeout, std::string* from = nullptr) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] {
      for (auto& [f, m] : notes) {
        if (m == message) {
          if (from != nullptr) *from = f;
          return true;
        }
      }
      return false;
    });
  }
};

inline void finish_into_completion(void* owner, XferTask* task, const XferResult& result) {
  static_cast<Completion*>(owner)->complete(result);
  delete task;
}

inline std::uint64_t next_xfer_id() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1);
}

inline XferTask* make_task(XferOp op, PeerId peer, std::vector<XferSegment> segments,
                           std::string_view notify, Completion* done) {
  auto* task = new XferTask(next_xfer_id(), op, peer, &finish_into_completion, done);
  std::uint64_t total = 0;
  for (const auto& s : segments) total += s.length;
  task->mutable_segments() = std::move(segments);
  task->set_total_bytes(total);
  task->set_notify(notify);
  return task;
}

inline XferSegment segment(RegionId local, std::byte* local_base, std::uint64_t local_offset,
                           RegionId remote, std::uint64_t remote_offset, std::uint64_t length) {
  return XferSegment{local, local_offset, local_base + local_offset, remote, remote_offset, length};
}

// Submits and waits (scaled deadline); the result, or kPending on timeout.
inline XferResult run(Backend& backend, XferTask* task, Completion& done,
                      std::chrono::seconds bound = 10s) {
  const Status s = backend.submit(task);
  EXPECT_TRUE(s) << s.to_string();
  if (!s) {
    delete task;
    return {};
  }
  return done.wait_for(pdr::test::scaled(bound));
}

}  // namespace pdr::transfer::test
