// The fault-injecting wrapper around a real backend (tcp on loopback): each planned fault happens
// on exactly the transfers it names, and the engine reports it.
#include "tests/support/transfer/faulty_backend.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <set>

#include "tests/support/status_matchers.h"
#include "tests/support/time_scale.h"
#include "tests/support/transfer/test_backends.h"
#include "transfer/engine.h"

namespace pdr::transfer {
namespace {

using namespace std::chrono_literals;
using pdr::test::scaled;

struct Side {
  std::unique_ptr<Engine> engine;
  RegionId region = kInvalidRegion;
  std::byte* base = nullptr;
};

Side make_side(const std::string& agent, const std::string& faults) {
  Side side;
  TestBackendSettings settings;
  settings.faults = faults;
  std::vector<std::unique_ptr<Backend>> backends;
  EXPECT_TRUE(make_test_backends({BackendKind::kTcp}, settings, &backends).is_ok());
  EXPECT_TRUE(Engine::create({.agent = agent}, std::move(backends), &side.engine).is_ok());
  EXPECT_TRUE(side.engine->allocate_region(1 << 20, &side.region, &side.base).is_ok());
  std::memset(side.base, agent[0], 1 << 20);
  return side;
}

XferResult read_once(Side& a, PeerId peer, RegionId remote, std::uint64_t bytes = 65536) {
  const RawSegment segment{a.region, 0, remote, 0, bytes};
  Completion done;
  EXPECT_TRUE(a.engine->submit(RawXfer{XferOp::kRead, peer, {&segment, 1}}, &done).is_ok());
  return done.wait_for(scaled(20s));
}

TEST(FaultPlan, Parses) {
  FaultPlan plan;
  ASSERT_TRUE(parse_fault_plan("latency_us=500,fail_every=3,fail_cause=access,corrupt_every=7",
                               &plan)
                  .is_ok());
  EXPECT_EQ(plan.latency, 500us);
  EXPECT_EQ(plan.fail_every, 3u);
  EXPECT_EQ(plan.fail_cause, XferCause::kAccess);
  EXPECT_EQ(plan.corrupt_every, 7u);
  ASSERT_TRUE(parse_fault_plan("", &plan).is_ok());
  EXPECT_EQ(plan.fail_every, 0u);
  EXPECT_TRUE(test::Fails(parse_fault_plan("fail_every=x", &plan), StatusCode::kInvalidValue,
                          "fault 'fail_every=x' is not latency_us=N, fail_every=N, "
                          "fail_cause=peer_gone|access|internal or corrupt_every=N"));
  EXPECT_FALSE(parse_fault_plan("explode=1", &plan).is_ok());
}

TEST(FaultyBackend, FailsEveryNthTransfer) {
  Side a = make_side("a", "fail_every=2,fail_cause=peer_gone");
  Side b = make_side("b", "");
  PeerId peer = kInvalidPeer;
  ASSERT_TRUE(a.engine->import_peer(b.engine->export_local(), &peer).is_ok());
  for (int i = 1; i <= 4; ++i) {
    const XferResult r = read_once(a, peer, b.region);
    if (i % 2 == 0) {
      EXPECT_EQ(r, (XferResult{XferState::kFailed, XferCause::kPeerGone, 0})) << i;
    } else {
      EXPECT_EQ(r.state, XferState::kDone) << i;
    }
  }
  EXPECT_EQ(a.engine->counters().xfers_failed.load(), 2u);
}

TEST(FaultyBackend, CorruptsWhatItIsToldTo) {
  Side a = make_side("a", "corrupt_every=2");
  Side b = make_side("b", "");
  PeerId peer = kInvalidPeer;
  ASSERT_TRUE(a.engine->import_peer(b.engine->export_local(), &peer).is_ok());
  ASSERT_EQ(read_once(a, peer, b.region).state, XferState::kDone);
  EXPECT_EQ(std::memcmp(a.base, b.base, 65536), 0) << "first transfer clean";
  ASSERT_EQ(read_once(a, peer, b.region).state, XferState::kDone);
  EXPECT_NE(std::memcmp(a.base, b.base, 65536), 0) << "second transfer corrupted";
  // A corrupted WRITE lands a flipped byte at the peer and leaves the source intact.
  std::memset(a.base, 'x', 65536);
  const RawSegment segment{a.region, 0, b.region, 0, 65536};
  for (int i = 0; i < 2; ++i) {
    Completion done;
    ASSERT_TRUE(a.engine->submit(RawXfer{XferOp::kWrite, peer, {&segment, 1}}, &done).is_ok());
    ASSERT_EQ(done.wait_for(scaled(20s)).state, XferState::kDone);
  }
  EXPECT_NE(std::memcmp(a.base, b.base, 65536), 0) << "fourth transfer corrupted at the peer";
  EXPECT_EQ(a.base[0], std::byte{'x'}) << "source restored";
}

TEST(FaultyBackend, DelaysAndStillCancels) {
  Side a = make_side("a", "latency_us=50000");
  Side b = make_side("b", "");
  PeerId peer = kInvalidPeer;
  ASSERT_TRUE(a.engine->import_peer(b.engine->export_local(), &peer).is_ok());
  const auto start = Clock::now();
  ASSERT_EQ(read_once(a, peer, b.region).state, XferState::kDone);
  EXPECT_GE(Clock::now() - start, 50ms);
  const RawSegment segment{a.region, 0, b.region, 0, 4096};
  Completion done;
  XferId id = 0;
  ASSERT_TRUE(a.engine->submit(RawXfer{XferOp::kRead, peer, {&segment, 1}}, &done, &id).is_ok());
  ASSERT_TRUE(a.engine->cancel(id).is_ok());
  EXPECT_EQ(done.wait_for(scaled(20s)).state, XferState::kCancelled);
}

// An inner backend whose submit() holds until the test opens it, and which finishes a transfer only
// when it is cancelled: a cancel it never sees leaves the transfer pending for ever.
class GateBackend final : public Backend {
 public:
  std::promise<void> entered;  // submit() started
  void open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

  BackendKind kind() const override { return BackendKind::kTcp; }
  Status start(const BackendContext&) override { return {}; }
  void stop() override {
    std::lock_guard lock(mu_);
    for (XferTask* task : tasks_) task->finish({XferState::kFailed, XferCause::kPeerGone, 0});
    tasks_.clear();
  }
  std::string local_address() const override { return "gate"; }
  bool can_reach(const proto::TransferDescriptor&, const proto::TransferDescriptor&) const override {
    return true;
  }
  Status add_peer(PeerId, const proto::TransferDescriptor&) override { return {}; }
  void remove_peer(PeerId) override {}
  Status submit(XferTask* task) override {
    entered.set_value();
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return open_; });
    tasks_.insert(task);
    return {};
  }
  void cancel(std::uint64_t id) override {
    XferTask* found = nullptr;
    {
      std::lock_guard lock(mu_);
      for (XferTask* task : tasks_) {
        if (task->id() == id) found = task;
      }
      if (found == nullptr) return;  // unknown id: dropped, as real backends do
      tasks_.erase(found);
    }
    found->finish({XferState::kCancelled, found->cancel_cause(), 0});
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  std::set<XferTask*> tasks_;
};

// A cancel landing after the delay queue handed the transfer on but before the inner backend knew
// its id used to reach the inner backend too early and be dropped.
TEST(FaultyBackend, CancelWhileTheInnerSubmitIsUnderWayIsNotLost) {
  auto gate_owned = std::make_unique<GateBackend>();
  GateBackend* gate = gate_owned.get();
  std::future<void> entered = gate->entered.get_future();
  std::promise<XferResult> finished;
  XferTask task(7, XferOp::kRead, 1,
                [](void* owner, XferTask*, const XferResult& result) {
                  static_cast<std::promise<XferResult>*>(owner)->set_value(result);
                },
                &finished);
  FaultPlan plan;
  plan.latency = 1ms;
  // Declared after the task: if an assertion fails, stopping it still finishes a live task.
  std::unique_ptr<Backend> faulty = make_faulty_backend(std::move(gate_owned), plan);
  ASSERT_TRUE(faulty->start(BackendContext{}).is_ok());
  ASSERT_TRUE(faulty->submit(&task).is_ok());
  ASSERT_EQ(entered.wait_for(scaled(20s)), std::future_status::ready);
  // As the engine does: mark the task, then tell the backend.
  ASSERT_TRUE(task.request_cancel(XferCause::kCancelled));
  faulty->cancel(task.id());
  gate->open();
  std::future<XferResult> result = finished.get_future();
  ASSERT_EQ(result.wait_for(scaled(20s)), std::future_status::ready) << "the cancel was lost";
  EXPECT_EQ(result.get().state, XferState::kCancelled);
}

}  // namespace
}  // namespace pdr::transfer
