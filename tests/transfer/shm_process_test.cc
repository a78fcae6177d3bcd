// The shm backend across a real process boundary (fork): memfds travel by SCM_RIGHTS, plain
// memory is reached by cross-memory attach, and a killed peer fails tasks kPeerGone. Plus an
// in-flight peer loss against a scripted fake peer.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <thread>

#include "tests/transfer/shm_test_harness.h"
#include "transfer/shm/shm_wire.h"
#include "transfer/shm/unix_channel.h"

namespace pdr::transfer::test {
namespace {

constexpr std::size_t kLen = 4 << 20;
constexpr PeerId kChild = 3;

// Reads one '\n'-terminated line from a pipe before the deadline; false on EOF or timeout.
bool read_line(int fd, std::chrono::microseconds timeout, std::string* line) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  line->clear();
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, 50) <= 0) continue;
    char c;
    if (::read(fd, &c, 1) != 1) return false;
    if (c == '\n') return true;
    line->push_back(c);
  }
  return false;
}

void write_line(int fd, const std::string& line) {
  const std::string text = line + "\n";
  [[maybe_unused]] ssize_t n = ::write(fd, text.data(), text.size());
}

// The child: serves one memfd and one plain region, filled from seeds 100 and 101; on "check" it
// reports both checksums; exits when the control pipe closes.
[[noreturn]] void run_child(int to_parent, int from_parent) {
  Side side("child");
  if (!side.start()) ::_exit(2);
  std::byte* shared = nullptr;
  std::byte* plain = nullptr;
  const RegionId shared_id = side.add_region(kLen, true, &shared);
  const RegionId plain_id = side.add_region(kLen, false, &plain);
  fill_random(shared, kLen, 100);
  fill_random(plain, kLen, 101);
  side.set_hook([&](std::string_view, std::string_view message) {
    if (message == "check") {
      write_line(to_parent, std::to_string(checksum(shared, kLen)) + " " +
                                std::to_string(checksum(plain, kLen)));
    }
  });
  write_line(to_parent, side.backend->local_address() + " " + std::to_string(shared_id) + " " +
                            std::to_string(plain_id));
  char c;
  while (::read(from_parent, &c, 1) > 0) {
  }
  side.backend->stop();
  ::_exit(0);
}

TEST(ShmProcessTest, ReadWriteNotifyAcrossProcessesThenPeerKilled) {
  int up[2];
  int down[2];
  ASSERT_EQ(::pipe2(up, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(down, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(up[0]);
    ::close(down[1]);
    run_child(up[1], down[0]);
  }
  ::close(up[1]);
  ::close(down[0]);
  UniqueFd from_child(up[0]);
  UniqueFd to_child(down[1]);

  Side parent("parent");
  ASSERT_TRUE(parent.start());
  std::byte* shared = nullptr;
  std::byte* plain = nullptr;
  const RegionId l_shared = parent.add_region(kLen, true, &shared);
  const RegionId l_plain = parent.add_region(kLen, false, &plain);

  std::string line;
  ASSERT_TRUE(read_line(from_child.get(), pdr::test::scaled(10s), &line));
  char address[128];
  unsigned r_shared = 0;
  unsigned r_plain = 0;
  ASSERT_EQ(std::sscanf(line.c_str(), "%127s %u %u", address, &r_shared, &r_plain), 3) << line;
  proto::TransferDescriptor d;
  d.agent = "child";
  d.hostname = "host-1";
  d.boot_id = "boot-1";
  d.endpoints.push_back({proto::EndpointBackend::kShm, address});
  const Status added = parent.backend->add_peer(kChild, d);
  ASSERT_TRUE(added) << added.to_string();

  // READ both child regions: memfd (mapped from the passed fd) and plain (cross-memory attach).
  auto expected_shared = make_memory(kLen, false);
  auto expected_plain = make_memory(kLen, false);
  fill_random(expected_shared->addr, kLen, 100);
  fill_random(expected_plain->addr, kLen, 101);
  Completion read_done;
  auto result = run(*parent.backend,
                    make_task(XferOp::kRead, kChild,
                              {segment(l_shared, shared, 0, r_shared, 0, kLen),
                               segment(l_plain, plain, 0, r_plain, 0, kLen)},
                              "", &read_done),
                    read_done);
  ASSERT_EQ(result.state, XferState::kDone) << xfer_cause_label(result.cause);
  EXPECT_EQ(checksum(shared, kLen), checksum(expected_shared->addr, kLen));
  EXPECT_EQ(checksum(plain, kLen), checksum(expected_plain->addr, kLen));

  // WRITE new data into both, then "check": the child reports what it sees, after the data.
  fill_random(shared, kLen, 200);
  fill_random(plain, kLen, 201);
  Completion write_done;
  result = run(*parent.backend,
               make_task(XferOp::kWrite, kChild,
                         {segment(l_shared, shared, 0, r_shared, 0, kLen),
                          segment(l_plain, plain, 0, r_plain, 0, kLen)},
                         "check", &write_done),
               write_done);
  ASSERT_EQ(result.state, XferState::kDone) << xfer_cause_label(result.cause);
  ASSERT_TRUE(read_line(from_child.get(), pdr::test::scaled(10s), &line));
  EXPECT_EQ(line, std::to_string(checksum(shared, kLen)) + " " + std::to_string(checksum(plain, kLen)));

  // The child dies: the next task fails kPeerGone without hanging.
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  Completion after_kill;
  result = run(*parent.backend,
               make_task(XferOp::kWrite, kChild, {segment(l_shared, shared, 0, r_shared, 0, 4096)}, "late",
                         &after_kill),
               after_kill);
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kPeerGone);
  parent.backend->stop();
  EXPECT_EQ(parent.counters.disconnects.load(), 1u);
}

// A scripted peer that answers HELLO with one memfd region, then hangs up on the first NOTIFY
// without acknowledging it: the task waiting for that ack must fail kPeerGone.
TEST(ShmProcessTest, PeerHangingUpBeforeTheAckFailsTheTask) {
  const std::string address = "@pdr-shm-fake-" + std::to_string(::getpid());
  UniqueFd listener;
  ASSERT_TRUE(shm::listen_unix(address, &listener));
  auto remote = make_memory(1 << 20, true);
  std::thread fake([&] {
    pollfd pfd{listener.get(), POLLIN, 0};
    if (::poll(&pfd, 1, 10000) <= 0) return;
    UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    shm::ReceiveBuffer rx;
    bool notified = false;
    while (!notified) {
      pollfd cp{conn.get(), POLLIN, 0};
      if (::poll(&cp, 1, 10000) <= 0) return;
      if (rx.read_once(conn.get()) != shm::ReceiveBuffer::ReadResult::kData) return;
      shm::Frame frame;
      std::size_t consumed = 0;
      while (decode_frame(rx.data(), &frame, &consumed).is_ok() && consumed > 0) {
        if (frame.type == shm::MsgType::kHello) {
          shm::RegionInfo info{.id = 5, .flags = shm::kRegionHasFd, .length = 1 << 20, .addr = 0};
          (void)shm::send_frame(conn.get(), shm::encode_region(info), remote->fd, std::chrono::milliseconds(1000));
          (void)shm::send_frame(conn.get(), shm::encode_regions_end(0), -1, std::chrono::milliseconds(1000));
        } else if (frame.type == shm::MsgType::kNotify) {
          notified = true;
        }
        rx.consume(consumed);
      }
    }
    // conn closes here without an ack.
  });

  Side a("agent-a");
  ASSERT_TRUE(a.start());
  std::byte* local = nullptr;
  const RegionId l = a.add_region(1 << 20, true, &local);
  fill_random(local, 1 << 20, 5);
  proto::TransferDescriptor d;
  d.agent = "fake";
  d.endpoints.push_back({proto::EndpointBackend::kShm, address});
  ASSERT_TRUE(a.backend->add_peer(kChild, d));
  Completion done;
  const auto result =
      run(*a.backend, make_task(XferOp::kWrite, kChild, {segment(l, local, 0, 5, 0, 1 << 20)}, "n", &done), done);
  fake.join();
  EXPECT_EQ(result.state, XferState::kFailed);
  EXPECT_EQ(result.cause, XferCause::kPeerGone);
  // The data itself did land in the fake peer's memfd before the notification.
  EXPECT_EQ(checksum(remote->addr, 1 << 20), checksum(local, 1 << 20));
}

}  // namespace
}  // namespace pdr::transfer::test
