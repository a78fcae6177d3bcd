// The RDMA backend end to end over the in-process fake NIC (tests/support/transfer/rdma/
// fake_verbs.h, injected as the backend's verbs loader): two backends in one process, each with its
// own RegionTable and EngineCounters, talking through the shared fake NIC and real loopback control
// sockets.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "transfer/backend.h"
#include "transfer/core/completion.h"
#include "tests/support/transfer/rdma/fake_verbs.h"
#include "transfer/rdma/rdma_backend.h"
#include "tests/support/time_scale.h"

namespace pdr::transfer {
namespace {

using namespace std::chrono_literals;
using rdma::FakeNic;

constexpr std::size_t kRegionBytes = 8u << 20;
constexpr PeerId kPeer = 7;

std::uint64_t checksum(const std::byte* data, std::size_t size) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (std::size_t i = 0; i < size; ++i) {
    h ^= std::to_integer<std::uint8_t>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

void fill_random(std::byte* data, std::size_t size, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < size; ++i) data[i] = static_cast<std::byte>(rng());
}

// One backend with its own memory, region table and counters.
struct Side {
  explicit Side(std::string agent_name, RdmaBackendOptions options = {}) : agent(std::move(agent_name)) {
    backend = make_rdma_backend(options, &rdma::load_fake_verbs_api);
    memory = std::make_unique<std::byte[]>(kRegionBytes);
    std::memset(memory.get(), 0, kRegionBytes);
    BackendContext context;
    context.agent = agent;
    context.regions = &regions;
    context.counters = &counters;
    context.on_notification = [this](std::string_view from, std::string_view message) {
      std::lock_guard lock(mu);
      if (on_note) on_note(from, message);
      notes.emplace_back(std::string(from), std::string(message));
      cv.notify_all();
    };
    start_status = backend->start(context);
    if (!start_status) return;
    EXPECT_TRUE(regions.register_region(memory.get(), kRegionBytes, MemKind::kHostDram, &region));
    EXPECT_TRUE(backend->on_region_registered(region, Region{reinterpret_cast<std::uintptr_t>(memory.get()),
                                                             kRegionBytes, MemKind::kHostDram}));
  }
  ~Side() { backend->stop(); }

  proto::TransferDescriptor descriptor() const {
    proto::TransferDescriptor d;
    d.agent = agent;
    d.endpoints.push_back({proto::EndpointBackend::kRdma, backend->local_address()});
    d.regions.push_back({region, kRegionBytes, proto::RegionKind::kDram});
    d.rkeys.push_back({region, backend->region_keys(region)});
    return d;
  }

  bool wait_notes(std::size_t count) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, test::scaled(10s), [&] { return notes.size() >= count; });
  }

  std::string agent;
  RegionTable regions;
  EngineCounters counters;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<std::byte[]> memory;
  RegionId region = kInvalidRegion;
  Status start_status;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<std::string, std::string>> notes;
  std::function<void(std::string_view, std::string_view)> on_note;  // runs under mu
};

void finish_into_completion(void* owner, XferTask* task, const XferResult& result) {
  static_cast<Completion*>(owner)->complete(result);
  delete task;
}

struct Seg {
  std::uint64_t local_offset;
  std::uint64_t remote_offset;
  std::uint64_t length;
};

std::atomic<std::uint64_t> g_next_id{1};

// Builds and submits a task A -> peer; the Completion gets the result. Returns submit's status.
Status submit(Side& from, RegionId remote_region, XferOp op, const std::vector<Seg>& segs,
              const std::string& notify, Completion* done, std::uint64_t* id_out = nullptr) {
  const std::uint64_t id = g_next_id++;
  auto* task = new XferTask(id, op, kPeer, finish_into_completion, done);
  std::uint64_t total = 0;
  for (const Seg& s : segs) {
    task->mutable_segments().push_back(XferSegment{from.region, s.local_offset,
                                                   from.memory.get() + s.local_offset,
                                                   remote_region, s.remote_offset, s.length});
    total += s.length;
  }
  task->set_total_bytes(total);
  task->set_notify(notify);
  if (id_out != nullptr) *id_out = id;
  Status status = from.backend->submit(task);
  if (!status) delete task;
  return status;
}

XferResult wait(Completion& done) { return done.wait_for(test::scaled(10s)); }

class RdmaFakeBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeNic::instance().set_device_count(1);
    FakeNic::instance().fail_nth_send_wr(0);
    a_ = std::make_unique<Side>("prefill-a", options_a());
    b_ = std::make_unique<Side>("decode-b");
    ASSERT_TRUE(a_->start_status) << a_->start_status.to_string();
    ASSERT_TRUE(b_->start_status) << b_->start_status.to_string();
    ASSERT_TRUE(a_->backend->can_reach(a_->descriptor(), b_->descriptor()));
    ASSERT_TRUE(a_->backend->add_peer(kPeer, b_->descriptor()));
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    EXPECT_EQ(FakeNic::instance().stats().live_qps, 0u);
    EXPECT_EQ(FakeNic::instance().stats().cq_overruns, 0u);
  }
  virtual RdmaBackendOptions options_a() {
    RdmaBackendOptions o;
    o.slice_bytes = 64 << 10;  // many WRs per task
    o.qps_per_peer = 4;
    return o;
  }

  XferResult write(std::vector<Seg> segs, const std::string& notify = {}) {
    Completion done;
    Status s = submit(*a_, b_->region, XferOp::kWrite, segs, notify, &done);
    if (!s) return {XferState::kFailed, XferCause::kInternal, 0};
    return wait(done);
  }

  std::unique_ptr<Side> a_;
  std::unique_ptr<Side> b_;
};

TEST_F(RdmaFakeBackend, LocalAddressAndKeys) {
  EXPECT_TRUE(a_->backend->local_address().starts_with("127.0.0.1:"));
  EXPECT_EQ(a_->backend->region_keys(a_->region).size(), 13u);
  EXPECT_TRUE(a_->backend->region_keys(a_->region + 1).empty());
  proto::TransferDescriptor no_keys = b_->descriptor();
  no_keys.rkeys.clear();
  EXPECT_FALSE(a_->backend->can_reach(a_->descriptor(), no_keys));
}

TEST_F(RdmaFakeBackend, WriteThenReadRandomDataManySegments) {
  fill_random(a_->memory.get(), 4 << 20, 11);
  std::mt19937 rng(5);
  std::vector<Seg> segs;
  std::uint64_t offset = 0;
  while (offset < (4u << 20) - (300u << 10)) {
    const std::uint64_t length = 1 + rng() % (300u << 10);
    segs.push_back({offset, offset, length});
    offset += length + rng() % 64;
  }
  ASSERT_GT(segs.size(), 20u);
  const XferResult result = write(segs);
  ASSERT_EQ(result.state, XferState::kDone) << xfer_cause_label(result.cause);
  std::uint64_t total = 0;
  for (const Seg& s : segs) {
    ASSERT_EQ(checksum(a_->memory.get() + s.local_offset, s.length),
              checksum(b_->memory.get() + s.remote_offset, s.length));
    total += s.length;
  }
  EXPECT_EQ(result.bytes_done, total);
  EXPECT_EQ(a_->counters.bytes_written.load(), total);
  EXPECT_EQ(a_->counters.connects.load(), 1u);

  // READ it back into the upper half of A's memory.
  std::vector<Seg> back;
  for (const Seg& s : segs) back.push_back({s.local_offset + (4u << 20), s.remote_offset, s.length});
  Completion done;
  ASSERT_TRUE(submit(*a_, b_->region, XferOp::kRead, back, {}, &done));
  ASSERT_EQ(wait(done).state, XferState::kDone);
  for (const Seg& s : segs) {
    ASSERT_EQ(std::memcmp(a_->memory.get() + s.local_offset,
                          a_->memory.get() + s.local_offset + (4u << 20), s.length),
              0);
  }
  EXPECT_EQ(a_->counters.bytes_read.load(), total);
}

TEST_F(RdmaFakeBackend, ConcurrentTasksFromManyThreads) {
  constexpr int kThreads = 4;
  constexpr int kTasks = 25;
  constexpr std::uint64_t kChunk = 16 << 10;
  fill_random(a_->memory.get(), kThreads * kTasks * kChunk * 2, 3);
  std::vector<std::thread> threads;
  std::atomic<int> done_ok{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::unique_ptr<Completion>> done;
      for (int i = 0; i < kTasks; ++i) {
        const std::uint64_t base = (static_cast<std::uint64_t>(t) * kTasks + i) * kChunk * 2;
        done.push_back(std::make_unique<Completion>());
        // Two segments per task, read for odd tasks (from B's zeroed memory is fine to compare
        // later: we only check the WRITEs' bytes).
        const XferOp op = i % 3 == 2 ? XferOp::kRead : XferOp::kWrite;
        if (op == XferOp::kRead) {
          ASSERT_TRUE(submit(*a_, b_->region, op, {{base + (4u << 20), base, kChunk}}, {}, done.back().get()));
        } else {
          ASSERT_TRUE(submit(*a_, b_->region, op, {{base, base, kChunk}, {base + kChunk, base + kChunk, kChunk}},
                             i % 2 == 0 ? "n" + std::to_string(i) : std::string(), done.back().get()));
        }
      }
      for (auto& d : done) {
        if (wait(*d).state == XferState::kDone) ++done_ok;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(done_ok.load(), kThreads * kTasks);
}

TEST_F(RdmaFakeBackend, NotifyArrivesAfterTheData) {
  fill_random(a_->memory.get(), 1 << 20, 21);
  const std::uint64_t expected = checksum(a_->memory.get(), 1 << 20);
  bool data_was_there = false;
  b_->on_note = [&](std::string_view, std::string_view) {
    data_was_there = checksum(b_->memory.get() + (2 << 20), 1 << 20) == expected;
  };
  const XferResult result = write({{0, 2 << 20, 1 << 20}}, "req-7");
  ASSERT_EQ(result.state, XferState::kDone);
  ASSERT_TRUE(b_->wait_notes(1));
  std::lock_guard lock(b_->mu);
  EXPECT_TRUE(data_was_there);
  EXPECT_EQ(b_->notes[0].first, "prefill-a");
  EXPECT_EQ(b_->notes[0].second, "req-7");
  EXPECT_EQ(a_->counters.notifications_sent.load(), 1u);
  EXPECT_EQ(b_->counters.notifications_received.load(), 1u);
}

TEST_F(RdmaFakeBackend, ReadWithNotify) {
  fill_random(b_->memory.get(), 64 << 10, 8);
  Completion done;
  ASSERT_TRUE(submit(*a_, b_->region, XferOp::kRead, {{0, 0, 64 << 10}}, "read-done", &done));
  ASSERT_EQ(wait(done).state, XferState::kDone);
  EXPECT_EQ(std::memcmp(a_->memory.get(), b_->memory.get(), 64 << 10), 0);
  ASSERT_TRUE(b_->wait_notes(1));
}

TEST_F(RdmaFakeBackend, BareNotifications) {
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(write({}, "hello-" + std::to_string(i)).state, XferState::kDone);
  }
  ASSERT_TRUE(b_->wait_notes(100));
  std::lock_guard lock(b_->mu);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(b_->notes[static_cast<std::size_t>(i)].second, "hello-" + std::to_string(i));
}

TEST_F(RdmaFakeBackend, OversizedNotifyIsRefusedBySubmit) {
  Completion done;
  const Status s = submit(*a_, b_->region, XferOp::kWrite, {}, std::string(5000, 'x'), &done);
  EXPECT_EQ(s.code(), StatusCode::kTooLarge);
}

TEST_F(RdmaFakeBackend, RemoteOutOfBoundsFailsWithAccessAndNextTransferWorks) {
  const XferResult bad = write({{0, kRegionBytes - 10, 100}});
  EXPECT_EQ(bad.state, XferState::kFailed);
  EXPECT_EQ(bad.cause, XferCause::kAccess);
  const XferResult good = write({{0, 0, 4096}}, "after");
  EXPECT_EQ(good.state, XferState::kDone) << xfer_cause_label(good.cause);
  EXPECT_EQ(a_->counters.connects.load(), 2u);  // re-handshaken
  EXPECT_GE(a_->counters.disconnects.load(), 1u);
}

TEST_F(RdmaFakeBackend, InjectedErrorFailsTaskThenReconnects) {
  ASSERT_EQ(write({{0, 0, 4096}}).state, XferState::kDone);
  FakeNic::instance().fail_nth_send_wr(3);
  const XferResult failed = write({{0, 0, 1 << 20}});
  EXPECT_EQ(failed.state, XferState::kFailed);
  EXPECT_EQ(failed.cause, XferCause::kPeerGone);
  fill_random(a_->memory.get(), 1 << 20, 99);
  ASSERT_EQ(write({{0, 0, 1 << 20}}).state, XferState::kDone);
  EXPECT_EQ(std::memcmp(a_->memory.get(), b_->memory.get(), 1 << 20), 0);
  EXPECT_EQ(a_->counters.connects.load(), 2u);
}

TEST_F(RdmaFakeBackend, FlushedQpsFailThenRecover) {
  ASSERT_EQ(write({{0, 0, 4096}}).state, XferState::kDone);
  for (std::uint32_t qpn : FakeNic::instance().live_qpns()) FakeNic::instance().flush_qp(qpn);
  // The flush is noticed either by a flushed receive (before the next task) or by the next task's
  // own WRs; either way a later transfer succeeds on fresh QPs.
  const auto deadline = std::chrono::steady_clock::now() + test::scaled(10s);
  XferResult result;
  int attempts = 0;
  do {
    result = write({{0, 0, 4096}});
    ++attempts;
    if (result.state != XferState::kDone) {
      EXPECT_EQ(result.cause, XferCause::kPeerGone);
    }
  } while (result.state != XferState::kDone && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(result.state, XferState::kDone);
  EXPECT_LE(attempts, 3);
  EXPECT_GE(a_->counters.disconnects.load(), 1u);
  EXPECT_EQ(a_->counters.connects.load(), 2u);
}

TEST_F(RdmaFakeBackend, SelectiveSignallingReducesCqes) {
  ASSERT_EQ(write({{0, 0, 4096}}).state, XferState::kDone);  // connect first
  FakeNic::instance().reset_stats();
  // 4 MiB in 64 KiB slices: 64 WRs per task over 4 QPs; 8 tasks.
  for (int i = 0; i < 8; ++i) ASSERT_EQ(write({{0, 0, 4 << 20}}).state, XferState::kDone);
  const rdma::FakeNicStats stats = FakeNic::instance().stats();
  EXPECT_EQ(stats.send_wrs, 8u * 64u);
  // Last WR per task per QP (4 per task) plus every 64th: far below one CQE per WR.
  EXPECT_LE(stats.send_cqes, 8u * 4u + 8u);
  EXPECT_LE(stats.post_send_calls, 8u * 4u);  // one chained doorbell per QP per task
}

TEST_F(RdmaFakeBackend, ReadsAreBoundedByTheRdAtomicDepth) {
  ASSERT_EQ(write({{0, 0, 4096}}).state, XferState::kDone);  // connect first
  fill_random(b_->memory.get(), 7 << 20, 77);
  FakeNic::instance().reset_stats();
  // 112 slices of 64 KiB over 4 QPs with at most 16 READs outstanding per QP: at least 7 chains.
  Completion done;
  ASSERT_TRUE(submit(*a_, b_->region, XferOp::kRead, {{0, 0, 7 << 20}}, {}, &done));
  ASSERT_EQ(wait(done).state, XferState::kDone);
  EXPECT_EQ(std::memcmp(a_->memory.get(), b_->memory.get(), 7 << 20), 0);
  const rdma::FakeNicStats stats = FakeNic::instance().stats();
  EXPECT_EQ(stats.send_wrs, 112u);
  EXPECT_GE(stats.post_send_calls, 7u);
}

TEST_F(RdmaFakeBackend, CancelWhileConnectingFinishesCancelled) {
  // A peer whose control port accepts TCP but never answers the handshake.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  proto::TransferDescriptor mute = b_->descriptor();
  mute.endpoints[0].address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  constexpr PeerId kMute = 9;
  ASSERT_TRUE(a_->backend->add_peer(kMute, mute));
  Completion done;
  auto* task = new XferTask(g_next_id++, XferOp::kWrite, kMute, finish_into_completion, &done);
  task->mutable_segments().push_back({a_->region, 0, a_->memory.get(), b_->region, 0, 64});
  ASSERT_TRUE(a_->backend->submit(task));
  ASSERT_TRUE(task->request_cancel(XferCause::kCancelled));
  a_->backend->cancel(task->id());
  const XferResult result = wait(done);  // within the connect timeout at worst
  EXPECT_EQ(result.state, XferState::kCancelled);
  EXPECT_EQ(result.cause, XferCause::kCancelled);
  ::close(listener);  // resets the half-open handshake, so the connector thread is free at once
  a_->backend->remove_peer(kMute);
}

TEST_F(RdmaFakeBackend, GarbageHandshakeCountsBadFrameAndClosesOnlyThatConnection) {
  ASSERT_EQ(write({{0, 0, 4096}}).state, XferState::kDone);
  const std::string address = b_->backend->local_address();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(std::stoi(address.substr(address.rfind(':') + 1))));
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const char frame[] = {10, 0, 0, 0, 'n', 'o', 't', ' ', 'a', ' ', 'r', 'e', 'c', '!'};
  ASSERT_EQ(::send(fd, frame, sizeof(frame), 0), static_cast<ssize_t>(sizeof(frame)));
  timeval timeout{static_cast<time_t>(test::scaled(10s).count() / 1000000), 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  char byte;
  EXPECT_EQ(::recv(fd, &byte, 1, 0), 0);  // B closed it after counting
  ::close(fd);
  EXPECT_EQ(b_->counters.bad_frames.load(), 1u);
  EXPECT_EQ(write({{0, 0, 4096}}, "still-up").state, XferState::kDone);
  EXPECT_EQ(a_->counters.connects.load(), 1u);
}

TEST_F(RdmaFakeBackend, CancelOfUnknownIdIsANoOp) {
  a_->backend->cancel(123456789);
  EXPECT_EQ(write({{0, 0, 64}}).state, XferState::kDone);
}

TEST_F(RdmaFakeBackend, PeerStoppedFailsPeerGone) {
  ASSERT_EQ(write({{0, 0, 4096}}).state, XferState::kDone);
  b_->backend->stop();
  const XferResult result = write({{0, 0, 4096}});
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kPeerGone);
}

TEST_F(RdmaFakeBackend, RemovePeerFailsItsTasksAndRefusesNewOnes) {
  ASSERT_EQ(write({{0, 0, 4096}}).state, XferState::kDone);
  a_->backend->remove_peer(kPeer);
  Completion done;
  EXPECT_EQ(submit(*a_, b_->region, XferOp::kWrite, {{0, 0, 64}}, {}, &done).code(),
            StatusCode::kNotFound);
}

TEST(RdmaFakeBackendStart, NoDeviceReportsUnavailable) {
  FakeNic::instance().set_device_count(0);
  auto backend = make_rdma_backend({}, &rdma::load_fake_verbs_api);
  const Status s = backend->start(BackendContext{});
  FakeNic::instance().set_device_count(1);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(s.message(), "rdma unavailable: no RDMA device found");
}

}  // namespace
}  // namespace pdr::transfer
