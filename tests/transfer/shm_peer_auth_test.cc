// Who may talk to the shm backend's abstract socket. A local process of another
// uid (a forked child that drops to nobody; the tests run as root) connects and says HELLO: it must
// get no frame and no SCM_RIGHTS fd, only a closed connection, and the refusal is counted. With its
// uid allowed (ShmBackendOptions::allowed_uids) it gets the memfd. Plus CmaGrant, the per-peer
// replacement of the process-wide PR_SET_PTRACER_ANY.
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <cstring>

#include "tests/transfer/shm_test_harness.h"
#include "transfer/shm/cma_grant.h"
#include "transfer/shm/shm_wire.h"

namespace pdr::transfer::test {
namespace {

constexpr uid_t kNobody = 65534;

// Child exit codes.
constexpr int kClosedEmpty = 0;  // the server closed without sending anything
constexpr int kGotFd = 1;        // an SCM_RIGHTS fd arrived
constexpr int kGotBytes = 4;     // frames (but no fd) arrived
constexpr int kTimedOut = 2;
constexpr int kNoSetuid = 3;

// Forks a child that becomes `uid`, connects to `address` ("@name"), says HELLO and reports what
// came back. Only async-signal-safe calls after fork.
int connect_as(uid_t uid, const std::string& address) {
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  const std::string name = address.substr(1);
  std::memcpy(sun.sun_path + 1, name.data(), name.size());
  const auto sun_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  const std::string hello = shm::encode_hello("intruder");
  const auto timeout = pdr::test::scaled(std::chrono::seconds(10));
  const timeval tv{static_cast<time_t>(timeout.count() / 1000000), 0};

  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(kNoSetuid);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&sun), sun_len) != 0) ::_exit(kClosedEmpty);
    (void)::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL);
    bool got_bytes = false;
    for (;;) {
      char data[4096];
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
      iovec iov{data, sizeof data};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      const ssize_t n = ::recvmsg(fd, &msg, 0);
      // msg_controllen is only meaningful when recvmsg succeeded (a reset leaves it as given).
      if (n >= 0) {
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
          if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) ::_exit(kGotFd);
        }
      }
      if (n > 0) {
        got_bytes = true;
        continue;
      }
      if (n == 0 || errno == ECONNRESET) ::_exit(got_bytes ? kGotBytes : kClosedEmpty);
      ::_exit(got_bytes ? kGotBytes : kTimedOut);
    }
  }
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(ShmPeerAuth, AProcessOfAnotherUidGetsNothingAndIsCounted) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another uid";
  Side server("server");
  ASSERT_TRUE(server.start());
  std::byte* memory = nullptr;
  server.add_region(1 << 20, /*memfd=*/true, &memory);
  server.add_region(1 << 20, /*memfd=*/false, &memory);
  EXPECT_EQ(connect_as(kNobody, server.backend->local_address()), kClosedEmpty);
  EXPECT_EQ(server.counters.shm_peers_refused.load(), 1u);
  EXPECT_EQ(server.counters.bad_frames.load(), 0u);
}

TEST(ShmPeerAuth, AnAllowedUidIsServed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become another uid";
  ShmBackendOptions options;
  options.allowed_uids = {0, kNobody};
  Side server("server", options);
  ASSERT_TRUE(server.start());
  std::byte* memory = nullptr;
  server.add_region(1 << 20, /*memfd=*/true, &memory);
  EXPECT_EQ(connect_as(kNobody, server.backend->local_address()), kGotFd);
  EXPECT_EQ(server.counters.shm_peers_refused.load(), 0u);
}

TEST(ShmPeerAuth, AConnectingSideRefusesAListenerOfAnotherUid) {
  // Same process, so same uid: allow only nobody and the listener (root) is refused.
  ShmBackendOptions options;
  options.allowed_uids = {kNobody};
  Side a("a", options);
  Side b("b");
  ASSERT_TRUE(a.start());
  ASSERT_TRUE(b.start());
  const Status s = a.backend->add_peer(7, b.descriptor());
  EXPECT_EQ(s.code(), StatusCode::kRejected) << s.to_string();
  EXPECT_EQ(a.counters.shm_peers_refused.load(), 1u);
}

TEST(CmaGrant, OnePeerProcessAtATime) {
  shm::CmaGrant grant;
  EXPECT_TRUE(grant.acquire(1000));
  EXPECT_TRUE(grant.acquire(1000));  // a second connection of the same process
  EXPECT_FALSE(grant.acquire(1001));
  grant.release(1001);  // not the holder: no effect
  grant.release(1000);
  EXPECT_FALSE(grant.acquire(1001));  // 1000 still has a connection
  grant.release(1000);
  EXPECT_EQ(grant.holder(), 0);
  EXPECT_TRUE(grant.acquire(1001));
  EXPECT_FALSE(grant.acquire(0));
  grant.release(1001);
}

}  // namespace
}  // namespace pdr::transfer::test
