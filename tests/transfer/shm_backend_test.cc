// The shm backend with two backends in one process (cross-process cases: shm_process_test.cc).
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <thread>

#include "tests/transfer/shm_test_harness.h"
#include "transfer/shm/shm_wire.h"
#include "transfer/shm/unix_channel.h"

namespace pdr::transfer::test {
namespace {

constexpr PeerId kPeerB = 7;

class ShmBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_ = std::make_unique<Side>("agent-a");
    b_ = std::make_unique<Side>("agent-b");
    ASSERT_TRUE(a_->start());
    ASSERT_TRUE(b_->start());
  }
  void connect() {
    const Status s = a_->backend->add_peer(kPeerB, b_->descriptor());
    ASSERT_TRUE(s) << s.to_string();
  }
  void round_trip(bool memfd) {
    constexpr std::size_t kLen = 3 << 20;
    std::byte* local = nullptr;
    std::byte* back = nullptr;
    std::byte* remote = nullptr;
    const RegionId l = a_->add_region(kLen, memfd, &local);
    const RegionId lb = a_->add_region(kLen, memfd, &back);
    const RegionId r = b_->add_region(kLen, memfd, &remote);
    connect();
    fill_random(local, kLen, 42);
    Completion w;
    auto result = run(*a_->backend,
                      make_task(XferOp::kWrite, kPeerB,
                                {segment(l, local, 0, r, 4096, kLen / 2),
                                 segment(l, local, kLen / 2, r, 4096 + kLen / 2, kLen / 2 - 4096)},
                                "", &w),
                      w);
    ASSERT_EQ(result.state, XferState::kDone);
    EXPECT_EQ(result.bytes_done, kLen - 4096);
    EXPECT_EQ(checksum(remote + 4096, kLen - 4096), checksum(local, kLen - 4096));
    Completion rd;
    result = run(*a_->backend,
                 make_task(XferOp::kRead, kPeerB, {segment(lb, back, 0, r, 4096, kLen - 4096)}, "",
                           &rd),
                 rd);
    ASSERT_EQ(result.state, XferState::kDone);
    EXPECT_EQ(checksum(back, kLen - 4096), checksum(local, kLen - 4096));
    EXPECT_EQ(a_->counters.bytes_written.load(), kLen - 4096);
    EXPECT_EQ(a_->counters.bytes_read.load(), kLen - 4096);
    EXPECT_EQ(a_->counters.connects.load(), 1u);
  }

  std::unique_ptr<Side> a_;
  std::unique_ptr<Side> b_;
};

TEST_F(ShmBackendTest, WriteThenReadOverMemfd) { round_trip(/*memfd=*/true); }

TEST_F(ShmBackendTest, WriteThenReadOverCrossMemoryAttach) { round_trip(/*memfd=*/false); }

TEST_F(ShmBackendTest, NotifyArrivesAfterTheData) {
  constexpr std::size_t kLen = 1 << 20;
  std::byte* local = nullptr;
  std::byte* remote = nullptr;
  const RegionId l = a_->add_region(kLen, true, &local);
  const RegionId r = b_->add_region(kLen, true, &remote);
  connect();
  fill_random(local, kLen, 7);
  const std::uint64_t expected = checksum(local, kLen);
  std::atomic<bool> data_was_there{false};
  b_->set_hook([&](std::string_view, std::string_view message) {
    if (message == "req-1") data_was_there = checksum(remote, kLen) == expected;
  });
  Completion done;
  const auto result =
      run(*a_->backend, make_task(XferOp::kWrite, kPeerB, {segment(l, local, 0, r, 0, kLen)}, "req-1", &done),
          done);
  ASSERT_EQ(result.state, XferState::kDone);
  std::string from;
  ASSERT_TRUE(b_->wait_note("req-1", pdr::test::scaled(5s), &from));
  EXPECT_EQ(from, "agent-a");
  EXPECT_TRUE(data_was_there.load());
  EXPECT_EQ(a_->counters.notifications_sent.load(), 1u);
  EXPECT_EQ(b_->counters.notifications_received.load(), 1u);
}

TEST_F(ShmBackendTest, BareNotification) {
  connect();
  Completion done;
  const auto result = run(*a_->backend, make_task(XferOp::kWrite, kPeerB, {}, "hello there", &done), done);
  ASSERT_EQ(result.state, XferState::kDone);
  // The task finished on the peer's ack, which follows delivery.
  std::lock_guard lock(b_->mu);
  ASSERT_EQ(b_->notes.size(), 1u);
  EXPECT_EQ(b_->notes[0].first, "agent-a");
  EXPECT_EQ(b_->notes[0].second, "hello there");
}

TEST_F(ShmBackendTest, ConcurrentTasksFromSeveralThreads) {
  constexpr std::size_t kSlot = 64 * 1024;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 25;
  std::byte* local = nullptr;
  std::byte* remote = nullptr;
  const RegionId l = a_->add_region(kSlot * kThreads * kPerThread, true, &local);
  const RegionId r = b_->add_region(kSlot * kThreads * kPerThread, false, &remote);  // CMA
  connect();
  fill_random(local, kSlot * kThreads * kPerThread, 3);
  std::vector<std::thread> threads;
  std::atomic<int> done_ok{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::uint64_t off = (static_cast<std::uint64_t>(t) * kPerThread + i) * kSlot;
        Completion done;
        const std::string note = "t" + std::to_string(t) + "-" + std::to_string(i);
        auto* task = make_task(XferOp::kWrite, kPeerB, {segment(l, local, off, r, off, kSlot)},
                               i % 2 == 0 ? note : std::string(), &done);
        if (!a_->backend->submit(task)) {
          delete task;
          continue;
        }
        if (done.wait_for(pdr::test::scaled(10s)).state == XferState::kDone) ++done_ok;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(done_ok.load(), kThreads * kPerThread);
  EXPECT_EQ(checksum(remote, kSlot * kThreads * kPerThread), checksum(local, kSlot * kThreads * kPerThread));
  EXPECT_EQ(b_->counters.notifications_received.load(), static_cast<std::uint64_t>(kThreads * ((kPerThread + 1) / 2)));
}

TEST_F(ShmBackendTest, CancelStopsALargeTransfer) {
  constexpr std::size_t kLen = 128u << 20;
  std::byte* local = nullptr;
  std::byte* remote = nullptr;
  const RegionId l = a_->add_region(kLen, true, &local);
  const RegionId r = b_->add_region(kLen, true, &remote);
  connect();
  Completion done;
  auto* task = make_task(XferOp::kWrite, kPeerB, {segment(l, local, 0, r, 0, kLen)}, "never", &done);
  const std::uint64_t id = task->id();
  ASSERT_TRUE(a_->backend->submit(task));
  // As the engine does: the cause first, then cancel(). The task may already be freed here only
  // if it finished, which it cannot have: 128 MiB take longer than these two calls.
  task->request_cancel(XferCause::kCancelled);
  a_->backend->cancel(id);
  const auto result = done.wait_for(pdr::test::scaled(10s));
  EXPECT_EQ(result.state, XferState::kCancelled);
  EXPECT_EQ(result.cause, XferCause::kCancelled);
  EXPECT_LT(result.bytes_done, kLen);
  EXPECT_EQ(b_->counters.notifications_received.load(), 0u);
  a_->backend->cancel(id);  // no longer held: a no-op
}

TEST_F(ShmBackendTest, OutOfRangeOrUnknownRemoteRegionIsAccessError) {
  std::byte* local = nullptr;
  std::byte* remote = nullptr;
  const RegionId l = a_->add_region(1 << 20, true, &local);
  const RegionId r = b_->add_region(1 << 20, true, &remote);
  connect();
  Completion past_end;
  auto result = run(*a_->backend,
                    make_task(XferOp::kWrite, kPeerB, {segment(l, local, 0, r, (1 << 20) - 100, 200)}, "", &past_end),
                    past_end);
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kAccess);
  Completion huge;
  result = run(*a_->backend,
               make_task(XferOp::kRead, kPeerB, {segment(l, local, 0, r, ~0ull - 10, 100)}, "", &huge), huge);
  EXPECT_EQ(result.cause, XferCause::kAccess);
  Completion unknown;
  result = run(*a_->backend,
               make_task(XferOp::kRead, kPeerB, {segment(l, local, 0, r + 1, 0, 100)}, "", &unknown), unknown);
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kAccess);
  EXPECT_EQ(b_->counters.access_refused.load(), 1u);
}

TEST_F(ShmBackendTest, UnregisteredCrossMemoryAttachRegionIsRevokedBeforeUnregisterReturns) {
  // Security review 14: the initiator cached the address of b's fd-less region; once b's
  // unregister returned (the engine: table, then on_region_unregistered), b may free or reuse the
  // memory, so a's later WRITE must not land there. Before the revoke it did (kDone).
  constexpr std::size_t kLen = 1 << 20;
  std::byte* local = nullptr;
  std::byte* remote = nullptr;
  const RegionId l = a_->add_region(kLen, true, &local);
  const RegionId r = b_->add_region(kLen, /*memfd=*/false, &remote);
  connect();
  fill_random(local, kLen, 5);
  Completion first;
  auto result = run(*a_->backend, make_task(XferOp::kWrite, kPeerB, {segment(l, local, 0, r, 0, kLen)}, "", &first),
                    first);
  ASSERT_EQ(result.state, XferState::kDone);

  ASSERT_TRUE(b_->regions.unregister_region(r));
  b_->backend->on_region_unregistered(r);
  std::memset(remote, 0xEE, kLen);  // reused for something else
  Completion second;
  result = run(*a_->backend, make_task(XferOp::kWrite, kPeerB, {segment(l, local, 0, r, 0, kLen)}, "", &second),
               second);
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kAccess);
  bool untouched = true;
  for (std::size_t i = 0; i < kLen; ++i) untouched = untouched && remote[i] == std::byte{0xEE};
  EXPECT_TRUE(untouched) << "a peer wrote through a cached address after unregister";
  EXPECT_EQ(b_->counters.bad_frames.load(), 0u);
  EXPECT_EQ(a_->counters.bad_frames.load(), 0u);
  EXPECT_EQ(a_->counters.disconnects.load(), 0u);  // acknowledged in time, still connected
}

TEST_F(ShmBackendTest, RegionRegisteredAfterConnectIsAskedFor) {
  std::byte* local = nullptr;
  const RegionId l = a_->add_region(1 << 20, true, &local);
  connect();
  std::byte* late_fd = nullptr;
  std::byte* late_plain = nullptr;
  const RegionId r1 = b_->add_region(1 << 20, true, &late_fd);
  const RegionId r2 = b_->add_region(1 << 20, false, &late_plain);
  fill_random(local, 1 << 20, 9);
  Completion done;
  const auto result = run(*a_->backend,
                          make_task(XferOp::kWrite, kPeerB,
                                    {segment(l, local, 0, r1, 0, 1 << 19), segment(l, local, 1 << 19, r2, 0, 1 << 19)},
                                    "", &done),
                          done);
  ASSERT_EQ(result.state, XferState::kDone);
  EXPECT_EQ(checksum(late_fd, 1 << 19), checksum(local, 1 << 19));
  EXPECT_EQ(checksum(late_plain, 1 << 19), checksum(local + (1 << 19), 1 << 19));
}

TEST_F(ShmBackendTest, PeerGoneFailsInFlightAndLaterTasks) {
  std::byte* local = nullptr;
  std::byte* remote = nullptr;
  const RegionId l = a_->add_region(1 << 20, true, &local);
  const RegionId r = b_->add_region(1 << 20, true, &remote);
  connect();
  b_->backend->stop();
  Completion first;
  auto result = run(*a_->backend,
                    make_task(XferOp::kWrite, kPeerB, {segment(l, local, 0, r, 0, 4096)}, "after-stop", &first),
                    first);
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kPeerGone);
  Completion later;
  result = run(*a_->backend, make_task(XferOp::kRead, kPeerB, {segment(l, local, 0, r, 0, 4096)}, "", &later), later);
  EXPECT_EQ(result.cause, XferCause::kPeerGone);
  // The I/O thread counts the lost connection when it drops it, which may come after a submitter
  // found the connection broken and failed its task: wait for it (once, not twice).
  const auto deadline = std::chrono::steady_clock::now() + pdr::test::scaled(5s);
  while (a_->counters.disconnects.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(a_->counters.disconnects.load(), 1u);
  a_->backend->remove_peer(kPeerB);
  Completion unknown;
  auto* task = make_task(XferOp::kRead, kPeerB, {}, "x", &unknown);
  EXPECT_FALSE(a_->backend->submit(task));
  delete task;
}

TEST_F(ShmBackendTest, AddPeerFailsWhenNothingListens) {
  proto::TransferDescriptor d = b_->descriptor();
  d.endpoints[0].address = "@pdr-shm-nobody-listens-here";
  const Status s = a_->backend->add_peer(kPeerB, d);
  EXPECT_FALSE(s);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_EQ(a_->counters.connect_failures.load(), 1u);
}

TEST_F(ShmBackendTest, GarbageClosesOnlyThatConnection) {
  std::byte* local = nullptr;
  std::byte* remote = nullptr;
  const RegionId l = a_->add_region(1 << 20, true, &local);
  const RegionId r = b_->add_region(1 << 20, true, &remote);
  connect();
  for (const std::string& garbage :
       {std::string("GET / HTTP/1.1\r\n\r\n"), shm::encode_notify(1, "before hello"),
        shm::encode_hello("x") + shm::encode_region_query(0),
        std::string("\x53\x50\x05\x00\xff\xff\xff\x7f", 8)}) {
    UniqueFd raw;
    ASSERT_TRUE(shm::connect_unix(b_->backend->local_address(), &raw));
    ASSERT_TRUE(shm::send_frame(raw.get(), garbage, -1, std::chrono::milliseconds(1000)));
    // The server closes: we read EOF (possibly after its answer to the HELLO) within the deadline.
    const auto deadline = std::chrono::steady_clock::now() + pdr::test::scaled(5s);
    bool closed = false;
    while (!closed && std::chrono::steady_clock::now() < deadline) {
      pollfd pfd{raw.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::recv(raw.get(), buf, sizeof(buf), 0);
      closed = n == 0 || (n < 0 && errno != EAGAIN);
    }
    EXPECT_TRUE(closed) << "garbage: " << garbage.size() << " bytes";
  }
  EXPECT_EQ(b_->counters.bad_frames.load(), 4u);
  Completion done;
  const auto result =
      run(*a_->backend, make_task(XferOp::kWrite, kPeerB, {segment(l, local, 0, r, 0, 4096)}, "still fine", &done),
          done);
  EXPECT_EQ(result.state, XferState::kDone);
}

TEST(ShmBackendReach, SameHostAndBootIdOnly) {
  auto backend = make_shm_backend({});
  proto::TransferDescriptor local;
  local.hostname = "h";
  local.boot_id = "b";
  proto::TransferDescriptor peer = local;
  peer.endpoints.push_back({proto::EndpointBackend::kShm, "@x"});
  EXPECT_TRUE(backend->can_reach(local, peer));
  proto::TransferDescriptor other_boot = peer;
  other_boot.boot_id = "c";
  EXPECT_FALSE(backend->can_reach(local, other_boot));
  proto::TransferDescriptor other_host = peer;
  other_host.hostname = "g";
  EXPECT_FALSE(backend->can_reach(local, other_host));
  proto::TransferDescriptor no_endpoint = peer;
  no_endpoint.endpoints = {{proto::EndpointBackend::kTcp, "127.0.0.1:1"}};
  EXPECT_FALSE(backend->can_reach(local, no_endpoint));
  proto::TransferDescriptor empty_local;
  proto::TransferDescriptor empty_peer;
  empty_peer.endpoints = peer.endpoints;
  EXPECT_FALSE(backend->can_reach(empty_local, empty_peer));
  EXPECT_EQ(backend->kind(), BackendKind::kShm);
}

}  // namespace
}  // namespace pdr::transfer::test
