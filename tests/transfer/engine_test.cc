// Engine behaviour that does not depend on a transport: validation before anything is sent,
// descriptors, peer import, backend choice, deadlines, cancel, notifications, region pinning.
// A scripted in-process backend stands in for the network; the shared suite
// (engine_suite_test.cc) runs the same API over the real backends.
#include "transfer/engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "tests/support/status_matchers.h"
#include "tests/support/time_scale.h"

namespace pdr::transfer {
namespace {

using namespace std::chrono_literals;
using pdr::test::scaled;

// Holds submitted tasks until the test finishes them; cancel() finishes from another thread, as a
// backend's I/O thread would.
class ScriptedBackend final : public Backend {
 public:
  explicit ScriptedBackend(BackendKind kind = BackendKind::kTcp, bool reach = true,
                           bool start_ok = true)
      : kind_(kind), reach_(reach), start_ok_(start_ok) {}
  ~ScriptedBackend() override { stop(); }

  BackendKind kind() const override { return kind_; }
  const std::string& secret() const { return context_.secret; }
  Status start(const BackendContext& context) override {
    if (!start_ok_) return Status(StatusCode::kIoError, "no device here");
    context_ = context;
    return {};
  }
  void stop() override {
    std::deque<XferTask*> left;
    {
      std::lock_guard lock(mu_);
      left.swap(tasks_);
    }
    for (XferTask* task : left) task->finish({XferState::kFailed, XferCause::kPeerGone, 0});
    for (std::thread& t : cancellers_) t.join();
    cancellers_.clear();
  }
  std::string local_address() const override { return "scripted:" + context_.agent; }
  bool can_reach(const proto::TransferDescriptor&, const proto::TransferDescriptor&) const override {
    return reach_;
  }
  Status add_peer(PeerId, const proto::TransferDescriptor&) override { return {}; }
  void remove_peer(PeerId) override {}
  Status submit(XferTask* task) override {
    std::lock_guard lock(mu_);
    tasks_.push_back(task);
    return {};
  }
  void cancel(std::uint64_t id) override {
    std::lock_guard lock(mu_);
    cancellers_.emplace_back([this, id] { finish_id(id, XferState::kCancelled); });
  }

  // Test side.
  std::size_t pending() {
    std::lock_guard lock(mu_);
    return tasks_.size();
  }
  XferTask* front() {
    std::lock_guard lock(mu_);
    return tasks_.empty() ? nullptr : tasks_.front();
  }
  void finish_front_done() {
    XferTask* task = nullptr;
    {
      std::lock_guard lock(mu_);
      task = tasks_.front();
      tasks_.pop_front();
    }
    for (const XferSegment& s : task->segments()) std::memset(s.local_addr, 0x5a, s.length);
    task->finish({XferState::kDone, XferCause::kNone, task->total_bytes()});
  }
  void deliver(std::string_view from, std::string_view message) {
    context_.on_notification(from, message);
  }

 private:
  void finish_id(std::uint64_t id, XferState state) {
    XferTask* task = nullptr;
    {
      std::lock_guard lock(mu_);
      for (auto it = tasks_.begin(); it != tasks_.end(); ++it) {
        if ((*it)->id() == id) {
          task = *it;
          tasks_.erase(it);
          break;
        }
      }
    }
    if (task != nullptr) task->finish({state, task->cancel_cause(), 0});
  }

  BackendKind kind_;
  bool reach_;
  bool start_ok_;
  BackendContext context_;
  std::mutex mu_;
  std::deque<XferTask*> tasks_;
  std::vector<std::thread> cancellers_;
};

struct Node {
  std::unique_ptr<Engine> engine;
  ScriptedBackend* backend = nullptr;
  RegionId region = kInvalidRegion;
  std::byte* base = nullptr;
  LayoutId layout = 0;
};

Node make_node(const std::string& agent, std::uint32_t blocks = 16) {
  Node node;
  auto backend = std::make_unique<ScriptedBackend>();
  node.backend = backend.get();
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(std::move(backend));
  EXPECT_TRUE(Engine::create({.agent = agent}, std::move(backends), &node.engine).is_ok());
  EXPECT_TRUE(node.engine->allocate_region(blocks * 1024, &node.region, &node.base).is_ok());
  EXPECT_TRUE(node.engine
                  ->define_layout({.region = node.region, .block_bytes = 1024, .stride = 1024,
                                   .block_count = blocks},
                                  &node.layout)
                  .is_ok());
  return node;
}

TEST(Engine, CreateNeedsAnAgentAndOneStartedBackend) {
  std::unique_ptr<Engine> engine;
  EXPECT_TRUE(test::Fails(Engine::create({}, {}, &engine), StatusCode::kInvalidValue,
                          "an engine needs an agent name"));
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(std::make_unique<ScriptedBackend>(BackendKind::kRdma, true, false));
  EXPECT_TRUE(test::Fails(Engine::create({.agent = "a"}, std::move(backends), &engine),
                          StatusCode::kIoError, "no transfer backend started: rdma: no device here"));
  backends.clear();
  backends.push_back(std::make_unique<ScriptedBackend>(BackendKind::kRdma, true, false));
  backends.push_back(std::make_unique<ScriptedBackend>(BackendKind::kTcp));
  ASSERT_TRUE(Engine::create({.agent = "a"}, std::move(backends), &engine).is_ok());
  EXPECT_EQ(engine->skipped_backends(), std::vector<std::string>{"rdma: no device here"});
  EXPECT_EQ(engine->started_backends(), std::vector<std::string>{"tcp scripted:a"});
}

TEST(Engine, ExportsADescriptorThePeerCanImport) {
  Node a = make_node("prefill-0");
  Node b = make_node("decode-0");
  proto::TransferDescriptor d;
  const std::string blob = a.engine->export_local();
  ASSERT_TRUE(proto::decode_descriptor(std::as_bytes(std::span(blob.data(), blob.size())), {}, &d)
                  .is_ok());
  EXPECT_EQ(d.agent, "prefill-0");
  EXPECT_FALSE(d.boot_id.empty());
  ASSERT_EQ(d.endpoints.size(), 1u);
  EXPECT_EQ(d.endpoints[0].address, "scripted:prefill-0");
  ASSERT_EQ(d.regions.size(), 1u);
  EXPECT_EQ(d.regions[0].length, 16u * 1024);
  ASSERT_EQ(d.layouts.size(), 1u);
  EXPECT_EQ(d.layouts[0].block_count, 16u);
  // The engine's random secret (tcp peers prove it): 32 bytes, its own, also in the backends' context.
  EXPECT_EQ(d.version_minor, proto::kTransferDescriptorMinor);
  ASSERT_EQ(d.secret.size(), proto::kTransferSecretBytes);
  EXPECT_EQ(a.backend->secret(), d.secret);
  proto::TransferDescriptor db;
  const std::string blob_b = b.engine->export_local();
  ASSERT_TRUE(proto::decode_descriptor(std::as_bytes(std::span(blob_b.data(), blob_b.size())), {}, &db)
                  .is_ok());
  EXPECT_NE(db.secret, d.secret);

  PeerId peer = kInvalidPeer;
  ASSERT_TRUE(b.engine->import_peer(blob, &peer).is_ok());
  EXPECT_EQ(b.engine->peer_backend(peer), "tcp");
  PeerId again = kInvalidPeer;
  ASSERT_TRUE(b.engine->import_peer(blob, &again).is_ok());
  EXPECT_EQ(again, peer) << "same descriptor, same peer";
  // A changed descriptor (the peer restarted with another pool) replaces the peer.
  RegionId extra = kInvalidRegion;
  std::byte* base = nullptr;
  ASSERT_TRUE(a.engine->allocate_region(4096, &extra, &base).is_ok());
  PeerId renewed = kInvalidPeer;
  ASSERT_TRUE(b.engine->import_peer(a.engine->export_local(), &renewed).is_ok());
  EXPECT_NE(renewed, peer);
  EXPECT_EQ(b.engine->peer_backend(peer), "");

  EXPECT_TRUE(test::Fails(b.engine->import_peer(std::string_view("\x81"), &peer),
                          StatusCode::kMalformed,
                          "msgpack data is truncated: the map at byte 0 declares 1 entries, leaving 2 "
                          "elements to come in 0 bytes"));
}

TEST(Engine, RefusesAPeerNoBackendReaches) {
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(std::make_unique<ScriptedBackend>(BackendKind::kShm, false));
  std::unique_ptr<Engine> engine;
  ASSERT_TRUE(Engine::create({.agent = "a"}, std::move(backends), &engine).is_ok());
  Node b = make_node("b");
  PeerId peer = kInvalidPeer;
  EXPECT_TRUE(test::Fails(engine->import_peer(b.engine->export_local(), &peer),
                          StatusCode::kRejected,
                          "no backend reaches agent 'b' (it offers tcp scripted:b)"));
}

TEST(Engine, ValidatesEverythingBeforeSubmitting) {
  Node a = make_node("a");
  Node b = make_node("b", 8);
  PeerId peer = kInvalidPeer;
  ASSERT_TRUE(a.engine->import_peer(b.engine->export_local(), &peer).is_ok());
  const std::uint32_t ok_ids[] = {1, 2};
  const std::uint32_t bad_local[] = {1, 16};
  const std::uint32_t bad_remote[] = {1, 8};
  Completion done;
  auto xfer = [&](std::span<const std::uint32_t> local, std::span<const std::uint32_t> remote) {
    return BlockXfer{XferOp::kRead, peer, a.layout, local, b.layout, remote};
  };
  EXPECT_TRUE(test::Fails(a.engine->submit(xfer(bad_local, ok_ids), &done), StatusCode::kOutOfRange,
                          "local block id [1] = 16 >= block_count 16"));
  EXPECT_TRUE(test::Fails(a.engine->submit(xfer(ok_ids, bad_remote), &done),
                          StatusCode::kOutOfRange, "remote block id [1] = 8 >= block_count 8"));
  BlockXfer unknown_peer = xfer(ok_ids, ok_ids);
  unknown_peer.peer = 99;
  EXPECT_TRUE(test::Fails(a.engine->submit(unknown_peer, &done), StatusCode::kNotFound,
                          "peer 99 is not known"));
  BlockXfer unknown_layout = xfer(ok_ids, ok_ids);
  unknown_layout.remote_layout = 7;
  EXPECT_TRUE(test::Fails(a.engine->submit(unknown_layout, &done), StatusCode::kNotFound,
                          "peer 'b' has no layout 7"));
  const std::string long_message(5000, 'x');
  BlockXfer long_notify = xfer(ok_ids, ok_ids);
  long_notify.notify = long_message;
  EXPECT_TRUE(test::Fails(a.engine->submit(long_notify, &done), StatusCode::kInvalidValue,
                          "notify message is 5000 bytes, limit 4096"));
  // Raw segments are checked against the peer's descriptor (8 blocks of 1 KiB).
  const RawSegment outside[] = {{a.region, 0, b.region, 7 * 1024, 2048}};
  EXPECT_TRUE(test::Fails(a.engine->submit(RawXfer{XferOp::kWrite, peer, outside}, &done),
                          StatusCode::kOutOfRange,
                          "segment 0: remote offset 7168 + length 2048 is outside region " +
                              std::to_string(b.region) + " (8192 bytes) of peer 'b'"));
  const RawSegment local_outside[] = {{a.region, 16 * 1024, b.region, 0, 1}};
  EXPECT_TRUE(test::Fails(a.engine->submit(RawXfer{XferOp::kWrite, peer, local_outside}, &done),
                          StatusCode::kOutOfRange,
                          "segment 0 (local): span offset 16384 length 1 leaves region " +
                              std::to_string(a.region) + " of 16384 bytes"));
  EXPECT_EQ(a.backend->pending(), 0u) << "nothing half-submitted";
  EXPECT_EQ(done.poll().state, XferState::kPending) << "completion untouched";
  EXPECT_EQ(a.engine->counters().xfers_submitted.load(), 0u);
}

TEST(Engine, CoalescesBlocksAndCompletes) {
  Node a = make_node("a");
  Node b = make_node("b");
  PeerId peer = kInvalidPeer;
  ASSERT_TRUE(a.engine->import_peer(b.engine->export_local(), &peer).is_ok());
  const std::uint32_t local[] = {0, 1, 2, 7};
  const std::uint32_t remote[] = {4, 5, 6, 9};
  Completion done;
  XferId id = 0;
  ASSERT_TRUE(a.engine
                  ->submit(BlockXfer{XferOp::kRead, peer, a.layout, local, b.layout, remote}, &done,
                           &id)
                  .is_ok());
  XferTask* task = a.backend->front();
  ASSERT_NE(task, nullptr);
  EXPECT_EQ(task->id(), id);
  ASSERT_EQ(task->segments().size(), 2u) << "blocks 0-2 -> 4-6 are one run";
  EXPECT_EQ(task->segments()[0].length, 3u * 1024);
  EXPECT_EQ(task->segments()[0].remote_offset, 4u * 1024);
  EXPECT_EQ(task->segments()[1].local_addr, a.base + 7 * 1024);
  EXPECT_EQ(task->total_bytes(), 4u * 1024);
  EXPECT_EQ(a.engine->in_flight(), 1u);
  EXPECT_TRUE(test::Fails(a.engine->unregister_region(a.region), StatusCode::kRejected,
                          "region " + std::to_string(a.region) + " has 1 transfers in flight"));
  a.backend->finish_front_done();
  EXPECT_EQ(done.wait_for(scaled(5s)), (XferResult{XferState::kDone, XferCause::kNone, 4096}));
  EXPECT_EQ(a.engine->counters().xfers_done.load(), 1u);
  EXPECT_EQ(a.engine->in_flight(), 0u);
  EXPECT_TRUE(test::Fails(a.engine->cancel(id), StatusCode::kNotFound,
                          "transfer " + std::to_string(id) + " is not in flight"));
}

TEST(Engine, CancelAndDeadlineFinishThroughTheBackend) {
  Node a = make_node("a");
  Node b = make_node("b");
  PeerId peer = kInvalidPeer;
  ASSERT_TRUE(a.engine->import_peer(b.engine->export_local(), &peer).is_ok());
  const std::uint32_t ids[] = {3};
  Completion cancelled;
  XferId id = 0;
  ASSERT_TRUE(a.engine
                  ->submit(BlockXfer{XferOp::kWrite, peer, a.layout, ids, b.layout, ids},
                           &cancelled, &id)
                  .is_ok());
  ASSERT_TRUE(a.engine->cancel(id).is_ok());
  EXPECT_EQ(cancelled.wait_for(scaled(5s)).state, XferState::kCancelled);
  EXPECT_EQ(cancelled.poll().cause, XferCause::kCancelled);

  Completion timed_out;
  BlockXfer xfer{XferOp::kWrite, peer, a.layout, ids, b.layout, ids};
  xfer.deadline = Clock::now() + 20ms;
  ASSERT_TRUE(a.engine->submit(xfer, &timed_out).is_ok());
  const XferResult result = timed_out.wait_for(scaled(5s));
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kTimeout);
  EXPECT_EQ(a.engine->counters().xfers_cancelled.load(), 2u);
  EXPECT_TRUE(a.engine->unregister_region(a.region).code() == StatusCode::kRejected)
      << "a layout still uses the region";
}

TEST(Engine, DestructionFailsWhatIsStillInFlight) {
  Completion done;
  {
    Node a = make_node("a");
    Node b = make_node("b");
    PeerId peer = kInvalidPeer;
    ASSERT_TRUE(a.engine->import_peer(b.engine->export_local(), &peer).is_ok());
    const std::uint32_t ids[] = {0};
    ASSERT_TRUE(a.engine
                    ->submit(BlockXfer{XferOp::kRead, peer, a.layout, ids, b.layout, ids}, &done)
                    .is_ok());
  }
  EXPECT_EQ(done.poll(), (XferResult{XferState::kFailed, XferCause::kPeerGone, 0}));
}

TEST(Engine, NotificationsQueueWaitAndEventFd) {
  Node a = make_node("a");
  const int fd = a.engine->notification_fd();
  ASSERT_GE(fd, 0);
  std::uint64_t value = 0;
  EXPECT_LT(::read(fd, &value, sizeof value), 0) << "not readable while empty";
  a.backend->deliver("p0", "req-1");
  a.backend->deliver("p1", "req-2");
  std::string from;
  EXPECT_TRUE(a.engine->wait_notification("req-2", Clock::now() + scaled(1s), &from));
  EXPECT_EQ(from, "p1");
  EXPECT_FALSE(a.engine->wait_notification("req-3", Clock::now() + 10ms));
  std::thread late([&] { a.backend->deliver("p2", "req-3"); });
  EXPECT_TRUE(a.engine->wait_notification("req-3", Clock::now() + scaled(5s), &from));
  late.join();
  EXPECT_EQ(from, "p2");
  std::vector<Notification> rest;
  EXPECT_EQ(a.engine->take_notifications(&rest), 1u);
  EXPECT_EQ(rest[0].message, "req-1");
  EXPECT_LT(::read(fd, &value, sizeof value), 0) << "drained with the queue";
}

TEST(Engine, RegionsAndLayouts) {
  Node a = make_node("a");
  LayoutId layout = 0;
  EXPECT_TRUE(test::Fails(a.engine->define_layout({.region = a.region, .block_bytes = 1024,
                                                   .stride = 1024, .block_count = 17},
                                                  &layout),
                          StatusCode::kOutOfRange, "layout ends at byte 17408, region has 16384"));
  std::vector<std::byte> mine(4096);
  RegionId region = kInvalidRegion;
  ASSERT_TRUE(a.engine->register_region(mine.data(), mine.size(), MemKind::kHostDram, &region)
                  .is_ok());
  ASSERT_TRUE(a.engine->unregister_region(region).is_ok());
  EXPECT_TRUE(test::Fails(a.engine->unregister_region(region), StatusCode::kNotFound,
                          "region " + std::to_string(region) + " is not registered"));
}

}  // namespace
}  // namespace pdr::transfer
