// The deadline-bounded socket calls against real loopback sockets: connects that succeed, are
// refused or time out; sends that must be split by the kernel or time out on a peer that does not
// read; receives that are cut short by the peer or time out; and signals landing in the middle of
// a wait, which must neither end the call nor stretch its deadline.
#include "transfer/net/blocking_socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "transfer/net/tcp_socket.h"
#include "tests/support/time_scale.h"

namespace pdr {
namespace {

using namespace std::chrono_literals;
using test::scaled;

SocketClock::time_point in(std::chrono::microseconds from_now) { return SocketClock::now() + from_now; }

struct Listener {
  UniqueFd fd;
  std::uint16_t port = 0;
};

Listener listen_loopback() {
  Listener out;
  int fd = -1;
  EXPECT_TRUE(open_listener("127.0.0.1", 0, &fd, &out.port).is_ok());
  out.fd.reset(fd);
  return out;
}

// A connected loopback pair: `client` from connect_tcp, `server` accepted (both non-blocking).
struct Pair {
  UniqueFd client;
  UniqueFd server;
};

Pair connected_pair() {
  Pair pair;
  Listener listener = listen_loopback();
  const auto deadline = in(scaled(5s));
  EXPECT_TRUE(connect_tcp("127.0.0.1", listener.port, deadline, &pair.client).is_ok());
  EXPECT_TRUE(wait_socket(listener.fd.get(), POLLIN, deadline, "accept").is_ok());
  pair.server.reset(::accept4(listener.fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  EXPECT_GE(pair.server.get(), 0) << std::strerror(errno);
  return pair;
}

std::string pattern(std::size_t size) {
  std::string bytes(size, '\0');
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 131 + i / 977);
  return bytes;
}

void set_buffer(int fd, int option, int bytes) {
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, option, &bytes, sizeof bytes), 0);
}

// ---------------------------------------------------------------- connect

TEST(BlockingSocket, ConnectsNonBlockingWithNoDelay) {
  Listener listener = listen_loopback();
  UniqueFd fd;
  ASSERT_TRUE(connect_tcp("127.0.0.1", listener.port, in(scaled(5s)), &fd).is_ok());
  EXPECT_NE(::fcntl(fd.get(), F_GETFL) & O_NONBLOCK, 0);
  EXPECT_NE(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC, 0);
  int nodelay = 0;
  socklen_t length = sizeof nodelay;
  ASSERT_EQ(::getsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &nodelay, &length), 0);
  EXPECT_NE(nodelay, 0);
}

TEST(BlockingSocket, ConnectToAPortNobodyListensOnIsRefusedAtOnce) {
  // Bound but not listening: the port stays ours for the test and answers SYNs with RST.
  UniqueFd bound(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(bound.get(), reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  socklen_t length = sizeof address;
  ASSERT_EQ(::getsockname(bound.get(), reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::uint16_t port = ntohs(address.sin_port);

  const auto start = SocketClock::now();
  UniqueFd fd;
  const Status status = connect_tcp("127.0.0.1", port, in(scaled(10s)), &fd);
  EXPECT_EQ(status.code(), StatusCode::kIoError);
  EXPECT_EQ(status.message(),
            "connect to 127.0.0.1:" + std::to_string(port) + ": " + std::strerror(ECONNREFUSED));
  EXPECT_LT(SocketClock::now() - start, scaled(2s));
  EXPECT_LT(fd.get(), 0);
}

TEST(BlockingSocket, ConnectTimesOutAtItsDeadline) {
  // A listener that never accepts, with the smallest backlog: once its queue is full the kernel
  // drops further SYNs, so a connect stays in progress until our deadline ends it.
  Listener listener = listen_loopback();
  ASSERT_EQ(::listen(listener.fd.get(), 0), 0);
  std::vector<UniqueFd> queued;
  const auto window = 300ms;
  Status status;
  std::chrono::nanoseconds took{0};
  for (int attempt = 0; attempt < 16 && status.is_ok(); ++attempt) {
    UniqueFd fd;
    const auto start = SocketClock::now();
    status = connect_tcp("127.0.0.1", listener.port, start + window, &fd);
    took = SocketClock::now() - start;
    if (status.is_ok()) queued.push_back(std::move(fd));
  }
  ASSERT_FALSE(status.is_ok()) << "16 connects went through a backlog of 0";
  EXPECT_EQ(status.message(), "connect to 127.0.0.1:" + std::to_string(listener.port) + ": timed out");
  EXPECT_GE(took, window);  // never before the deadline
  EXPECT_LT(took, window + scaled(2s));
}

TEST(BlockingSocket, ResolvingANameThatIsNoAddressFailsBeforeConnecting) {
  UniqueFd fd;
  // An empty name resolves to nothing without asking DNS.
  const Status status = connect_tcp("", 80, in(scaled(1s)), &fd);
  EXPECT_EQ(status.code(), StatusCode::kBadAddress) << status.to_string();
}

// ---------------------------------------------------------------- send

TEST(BlockingSocket, SendAllDeliversEveryByteThroughPartialWrites) {
  Pair pair = connected_pair();
  // A small send buffer: one send() takes a few KiB at most, so 4 MiB goes out in many partial
  // writes with waits for room in between. (The receive buffer keeps its size: a tiny window
  // would crawl at one delayed ACK per window.)
  set_buffer(pair.client.get(), SO_SNDBUF, 4096);
  const std::string sent = pattern(4 << 20);
  auto sender = std::async(std::launch::async, [&] {
    return send_all(pair.client.get(), sent, in(scaled(30s)));
  });
  std::string received(sent.size(), '\0');
  for (std::size_t at = 0; at < received.size();) {
    const std::size_t piece = std::min<std::size_t>(1000, received.size() - at);
    ASSERT_TRUE(recv_exact(pair.server.get(), received.data() + at, piece, in(scaled(30s))).is_ok());
    at += piece;
  }
  const Status status = sender.get();
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_TRUE(received == sent);
}

TEST(BlockingSocket, SendTimesOutWhenThePeerDoesNotRead) {
  Pair pair = connected_pair();
  set_buffer(pair.client.get(), SO_SNDBUF, 4096);
  set_buffer(pair.server.get(), SO_RCVBUF, 4096);
  const std::string bytes = pattern(16 << 20);
  const auto window = 300ms;
  const auto start = SocketClock::now();
  const Status status = send_all(pair.client.get(), bytes, start + window);
  const auto took = SocketClock::now() - start;
  EXPECT_EQ(status.code(), StatusCode::kIoError);
  EXPECT_EQ(status.message(), "send: timed out");
  EXPECT_GE(took, window);
  EXPECT_LT(took, window + scaled(2s));
}

TEST(BlockingSocket, SendToAPeerThatWentAwayFailsWithoutSigpipe) {
  Pair pair = connected_pair();
  pair.server.reset();  // closed with nothing read: our next writes meet a reset
  const std::string bytes = pattern(1 << 20);
  Status status;
  // The first send may still land in the buffer; a reset arrives at the latest with the next.
  for (int i = 0; i < 16 && status.is_ok(); ++i) status = send_all(pair.client.get(), bytes, in(scaled(5s)));
  EXPECT_EQ(status.code(), StatusCode::kIoError);
  EXPECT_TRUE(status.message().starts_with("send: ")) << status.message();
}

// ---------------------------------------------------------------- receive

TEST(BlockingSocket, RecvExactAssemblesWhatArrivesInPieces) {
  Pair pair = connected_pair();
  const std::string sent = pattern(3000);
  std::thread writer([&] {
    for (std::size_t at = 0; at < sent.size(); at += 1000) {
      EXPECT_TRUE(send_all(pair.server.get(), sent.data() + at, 1000, in(scaled(5s))).is_ok());
    }
  });
  std::string received(sent.size(), '\0');
  const Status status = recv_exact(pair.client.get(), received.data(), received.size(), in(scaled(5s)));
  writer.join();
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(received, sent);
}

TEST(BlockingSocket, RecvExactReportsAPeerThatClosesMidRead) {
  Pair pair = connected_pair();
  ASSERT_TRUE(send_all(pair.server.get(), "0123456789", in(scaled(5s))).is_ok());
  ASSERT_EQ(::shutdown(pair.server.get(), SHUT_WR), 0);
  char buffer[100] = {};
  const Status status = recv_exact(pair.client.get(), buffer, sizeof buffer, in(scaled(5s)));
  EXPECT_EQ(status.code(), StatusCode::kIoError);
  EXPECT_EQ(status.message(), "receive: closed by the peer after 10 of 100 bytes");
  EXPECT_EQ(std::string(buffer, 10), "0123456789");
}

TEST(BlockingSocket, RecvExactTimesOutAtItsDeadline) {
  Pair pair = connected_pair();
  ASSERT_TRUE(send_all(pair.server.get(), "ab", in(scaled(5s))).is_ok());
  char buffer[4];
  const auto window = 200ms;
  const auto start = SocketClock::now();
  const Status status = recv_exact(pair.client.get(), buffer, sizeof buffer, start + window);
  const auto took = SocketClock::now() - start;
  EXPECT_EQ(status.message(), "receive: timed out");
  EXPECT_GE(took, window);
  EXPECT_LT(took, window + scaled(2s));
}

TEST(BlockingSocket, APassedDeadlineStillTakesWhatIsAlreadyThere) {
  Pair pair = connected_pair();
  ASSERT_TRUE(send_all(pair.server.get(), "abcd", in(scaled(5s))).is_ok());
  ASSERT_TRUE(wait_socket(pair.client.get(), POLLIN, in(scaled(5s)), "wait").is_ok());
  char buffer[4];
  ASSERT_TRUE(recv_exact(pair.client.get(), buffer, 4, SocketClock::now() - 1s).is_ok());
  EXPECT_EQ(std::string(buffer, 4), "abcd");
  EXPECT_EQ(recv_exact(pair.client.get(), buffer, 1, SocketClock::now() - 1s).message(),
            "receive: timed out");
}

TEST(BlockingSocket, RecvSomeReturnsWhatArrivedThenZeroAtTheEnd) {
  Pair pair = connected_pair();
  ASSERT_TRUE(send_all(pair.server.get(), "hello", in(scaled(5s))).is_ok());
  ASSERT_EQ(::shutdown(pair.server.get(), SHUT_WR), 0);
  std::string received;
  for (;;) {
    char buffer[64];
    std::size_t n = 0;
    ASSERT_TRUE(recv_some(pair.client.get(), buffer, sizeof buffer, in(scaled(5s)), &n).is_ok());
    if (n == 0) break;
    received.append(buffer, n);
  }
  EXPECT_EQ(received, "hello");
}

TEST(BlockingSocket, WithoutADeadlineBlockingSocketsWorkAsPlainBlockingCalls) {
  Pair pair = connected_pair();
  const int flags = ::fcntl(pair.client.get(), F_GETFL);
  ASSERT_EQ(::fcntl(pair.client.get(), F_SETFL, flags & ~O_NONBLOCK), 0);
  std::thread writer([&] {
    EXPECT_TRUE(send_all(pair.server.get(), pattern(100000), in(scaled(5s))).is_ok());
  });
  std::string received(100000, '\0');
  ASSERT_TRUE(recv_exact(pair.client.get(), received.data(), received.size(), kNoDeadline).is_ok());
  writer.join();
  EXPECT_EQ(received, pattern(100000));
  ASSERT_TRUE(send_all(pair.client.get(), "x", kNoDeadline).is_ok());
}

// ---------------------------------------------------------------- signals

std::atomic<int> signals_seen{0};
void count_signal(int) { signals_seen.fetch_add(1, std::memory_order_relaxed); }

// SIGUSR1 counted, without SA_RESTART (poll is never restarted anyway: every signal that lands
// in a wait makes it return EINTR). Restores the previous action on destruction.
class SignalCounter {
 public:
  SignalCounter() {
    struct sigaction action {};
    action.sa_handler = count_signal;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGUSR1, &action, &previous_);
  }
  ~SignalCounter() { ::sigaction(SIGUSR1, &previous_, nullptr); }

 private:
  struct sigaction previous_ {};
};

TEST(BlockingSocket, SignalsDuringAWaitDoNotEndTheCall) {
  SignalCounter counter;
  Pair pair = connected_pair();
  std::promise<pthread_t> reader_id;
  char buffer[4] = {};
  auto reader = std::async(std::launch::async, [&] {
    reader_id.set_value(::pthread_self());
    return recv_exact(pair.client.get(), buffer, sizeof buffer, in(scaled(10s)));
  });
  const pthread_t target = reader_id.get_future().get();
  // Interrupt the reader's wait a few times; each signal is handled before the next is sent.
  const int before = signals_seen.load();
  for (int i = 1; i <= 5; ++i) {
    ASSERT_EQ(::pthread_kill(target, SIGUSR1), 0);
    const auto limit = in(scaled(5s));
    while (signals_seen.load() < before + i && SocketClock::now() < limit) std::this_thread::yield();
  }
  EXPECT_GE(signals_seen.load(), before + 5);
  EXPECT_EQ(reader.wait_for(0s), std::future_status::timeout) << "a signal ended the receive";
  ASSERT_TRUE(send_all(pair.server.get(), "data", in(scaled(5s))).is_ok());
  const Status status = reader.get();
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(std::string(buffer, 4), "data");
}

TEST(BlockingSocket, SignalsDuringAWaitDoNotStretchItsDeadline) {
  SignalCounter counter;
  Pair pair = connected_pair();
  std::promise<pthread_t> reader_id;
  std::atomic<bool> done{false};
  char buffer[4];
  const auto window = 300ms;
  SocketClock::time_point start;
  auto reader = std::async(std::launch::async, [&] {
    reader_id.set_value(::pthread_self());
    start = SocketClock::now();
    Status status = recv_exact(pair.client.get(), buffer, sizeof buffer, start + window);
    done.store(true);
    return status;
  });
  const pthread_t target = reader_id.get_future().get();
  // A signal every millisecond until the call ends: a wait that restarted with the whole window
  // after each one would never end.
  const int before = signals_seen.load();
  const auto limit = in(window + scaled(5s));
  while (!done.load() && SocketClock::now() < limit) {
    ::pthread_kill(target, SIGUSR1);
    std::this_thread::sleep_for(1ms);  // pacing, not synchronisation
  }
  const Status status = reader.get();
  const auto took = SocketClock::now() - start;
  EXPECT_EQ(status.message(), "receive: timed out");
  EXPECT_GT(signals_seen.load(), before + 10);
  EXPECT_GE(took, window);
  EXPECT_LT(took, window + scaled(2s));
}

}  // namespace
}  // namespace pdr
