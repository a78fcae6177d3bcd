// HTTP server resource bounds against hostile or slow clients (slow headers and bodies, header
// and body limits, descriptor exhaustion): real sockets on loopback, port 0, every wait bounded by a deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include <cerrno>
#include <csignal>
#include <future>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "router/http/http_server.h"
#include "tests/support/http_client.h"
#include "tests/support/time_scale.h"

namespace pdr::http {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using pdr::test::HttpClient;
using pdr::test::HttpResponse;
using pdr::test::scaled;

constexpr size_t kAnswerBytes = 12 * 1024;  // about /metrics' size

// Polls `pred` every few ms until it holds or `timeout` (scaled) passes.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = 10s) {
  const auto until = Clock::now() + scaled(timeout);
  while (!pred()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

// A blocking loopback socket with a small receive buffer (set before connect, so the window
// the server sees is small too).
int connect_small_rcvbuf(uint16_t port, int rcvbuf) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads whatever is there within `timeout`; false on EOF/error or timeout with nothing.
bool read_some(int fd, std::string* out, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
  char buf[65536];
  const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  if (n <= 0) return false;
  out->append(buf, static_cast<size_t>(n));
  return true;
}

// Splits complete Content-Length-framed responses off the front of `data`; returns bodies.
std::vector<std::string> take_responses(std::string* data) {
  std::vector<std::string> bodies;
  for (;;) {
    const size_t end = data->find("\r\n\r\n");
    if (end == std::string::npos) break;
    const size_t cl = data->find("Content-Length: ");
    if (cl == std::string::npos || cl > end) break;
    const size_t length = std::stoul(data->substr(cl + 16, data->find("\r\n", cl) - cl - 16));
    if (data->size() < end + 4 + length) break;
    bodies.push_back(data->substr(end + 4, length));
    data->erase(0, end + 4 + length);
  }
  return bodies;
}

class HttpBoundsTest : public ::testing::Test {
 protected:
  void TearDown() override { server_.stop(2s); }

  void start(ServerOptions options = {}) {
    options.host = "127.0.0.1";
    Status s = server_.start(options, [](Request&& r, ResponseWriter w) {
      if (r.path.rfind("/n/", 0) == 0) {
        // A synchronous answer about the size of /metrics, numbered for the order check.
        std::string body = r.path.substr(3) + ":";
        body.resize(kAnswerBytes, 'm');
        w.send(Response::text(200, std::move(body)));
      } else if (r.path == "/large") {
        w.send(Response::text(200, std::string(8 << 20, 'L')));
      } else if (r.path == "/echo") {
        w.send(Response::text(200, r.body));
      } else {
        w.send(Response::text(200, "hello"));
      }
    });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
  }

  Server server_;
};

// #3: a client pipelines thousands of cheap requests with large answers and never reads. The
// server must stop parsing once 256 KiB of answers wait (today it rendered every answer into
// memory); once the client reads, every answer arrives, in order.
TEST_F(HttpBoundsTest, PipeliningClientThatNeverReadsIsBounded) {
  start();
  const int fd = connect_small_rcvbuf(server_.port(), 4096);
  ASSERT_GE(fd, 0);
  constexpr int kRequests = 3000;
  std::string requests;
  for (int i = 0; i < kRequests; ++i) requests += "GET /n/" + std::to_string(i) + " HTTP/1.1\r\nHost: a\r\n\r\n";
  std::atomic<bool> sent_all{false};
  std::thread sender([&] {
    size_t off = 0;
    while (off < requests.size()) {
      const ssize_t n = ::send(fd, requests.data() + off, requests.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
    sent_all = true;
  });
  // On an early failure: unblock and join the sender before the thread object goes.
  struct Joiner {
    std::thread& t;
    int fd;
    ~Joiner() {
      if (t.joinable()) {
        ::shutdown(fd, SHUT_RDWR);
        t.join();
      }
    }
  } joiner{sender, fd};

  ASSERT_TRUE(eventually([&] { return server_.stats().output_pauses.load() >= 1; }))
      << "the server never stopped reading; answers queued: " << server_.stats().output_buffered_bytes.load()
      << " bytes, requests parsed: " << server_.stats().requests.load();
  // While the client does not read, what is queued stays near the high-water mark (one answer
  // over it at most) and parsing does not go on.
  uint64_t max_queued = 0;
  const auto until = Clock::now() + 300ms;
  while (Clock::now() < until) {
    max_queued = std::max<uint64_t>(max_queued, server_.stats().output_buffered_bytes.load());
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_LE(max_queued, kOutputHighWater + kAnswerBytes + 1024);
  const uint64_t parsed = server_.stats().requests.load();
  EXPECT_LT(parsed, static_cast<uint64_t>(kRequests / 2)) << "the server kept answering a client that never reads";

  // Now read everything: all answers, in request order.
  std::string data;
  int next = 0;
  const auto deadline = Clock::now() + scaled(60s);
  while (next < kRequests && Clock::now() < deadline) {
    read_some(fd, &data, 100ms);
    for (const std::string& body : take_responses(&data)) {
      ASSERT_EQ(body.substr(0, body.find(':')), std::to_string(next)) << "answer out of order";
      ASSERT_EQ(body.size(), kAnswerBytes);
      ++next;
    }
  }
  EXPECT_EQ(next, kRequests);
  sender.join();
  EXPECT_TRUE(sent_all.load());
  ::close(fd);
  EXPECT_TRUE(eventually([&] { return server_.stats().output_buffered_bytes.load() == 0; }));
}

// #8: a body trickled one byte every 100 ms must get 408 at body_read_timeout, although each
// byte arrives well within header_read_timeout (which used to be re-armed on every read).
TEST_F(HttpBoundsTest, TrickledBodyGets408AtTheBodyDeadline) {
  ServerOptions o;
  o.header_read_timeout = 1000ms;
  o.body_read_timeout = 500ms;
  start(o);
  HttpClient c;
  ASSERT_EQ(c.connect("127.0.0.1", server_.port(), 5s), "");
  ASSERT_EQ(c.send_raw("POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n"), "");
  const auto t0 = Clock::now();
  HttpResponse r;
  const auto deadline = t0 + scaled(5s);
  while (Clock::now() < deadline) {
    if (!c.send_raw("x").empty()) break;  // the server closed after answering
    r = c.read_response(100ms);
    if (r.ok()) break;
  }
  if (!r.ok()) r = c.read_response(1s);
  ASSERT_TRUE(r.ok()) << "no answer while the body trickled in: " << r.error;
  const auto elapsed = Clock::now() - t0;
  EXPECT_EQ(r.status, 408);
  EXPECT_NE(r.body.find("\"request_timeout\""), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("request body"), std::string::npos) << r.body;
  EXPECT_GE(elapsed, 450ms);
  EXPECT_LT(elapsed, scaled(3s));
  EXPECT_EQ(server_.stats().body_timeouts.load(), 1u);
  EXPECT_EQ(server_.stats().header_timeouts.load(), 0u);
}

// #17: a slow reader of a large answer must get all of it, although reading it takes longer
// than keep_alive_idle (the idle timer used to start as soon as the answer was queued).
TEST_F(HttpBoundsTest, SlowReaderOfLargeAnswerIsNotCutByTheIdleTimer) {
  // Scaled: queued output that makes no progress for keep_alive_idle is closed (the next test),
  // and on a busy machine a sanitizer build's client can be held off the CPU for 200 ms. The
  // client's pause per read scales with it, so reading the whole answer (128 reads at least)
  // still takes longer than keep_alive_idle.
  const auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(scaled(200ms));
  ServerOptions o;
  o.keep_alive_idle = idle;
  start(o);
  const int fd = connect_small_rcvbuf(server_.port(), 65536);
  ASSERT_GE(fd, 0);
  const std::string req = "GET /large HTTP/1.1\r\nHost: a\r\n\r\n";
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  std::string data;
  std::vector<std::string> bodies;
  const auto t0 = Clock::now();
  const auto deadline = t0 + scaled(60s);
  const auto read_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(scaled(1000ms));
  while (bodies.empty() && Clock::now() < deadline) {
    if (!read_some(fd, &data, read_timeout)) break;  // closed (truncated) or stuck
    bodies = take_responses(&data);
    std::this_thread::sleep_for(idle / 80);  // a slow client: ~25 MB/s at most unscaled
  }
  ASSERT_EQ(bodies.size(), 1u) << "answer truncated after " << data.size() << " bytes";
  EXPECT_EQ(bodies[0].size(), size_t{8} << 20);
  EXPECT_GT(Clock::now() - t0, idle) << "the client was not slower than keep_alive_idle";
  EXPECT_EQ(server_.stats().write_stalls.load(), 0u);
  // Then the idle connection is closed after keep_alive_idle as before.
  EXPECT_TRUE(eventually([&] { return server_.stats().idle_timeouts.load() == 1; }));
  ::close(fd);
}

// #17 (other side): queued output that makes no progress for keep_alive_idle closes the
// connection.
TEST_F(HttpBoundsTest, ClientThatNeverReadsALargeAnswerIsClosed) {
  ServerOptions o;
  o.keep_alive_idle = 300ms;
  start(o);
  const int fd = connect_small_rcvbuf(server_.port(), 4096);
  ASSERT_GE(fd, 0);
  const std::string req = "GET /large HTTP/1.1\r\nHost: a\r\n\r\n";
  ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  EXPECT_TRUE(eventually([&] { return server_.stats().write_stalls.load() == 1; }));
  EXPECT_TRUE(eventually([&] { return server_.stats().connections_active.load() == 0; }));
  EXPECT_EQ(server_.stats().output_buffered_bytes.load(), 0u);
  ::close(fd);
}

// #16: obs-fold (a header value continued on a line starting with SP/HTAB) is refused with 400,
// whether the fold arrives in one read or split across two.
TEST_F(HttpBoundsTest, ObsFoldIs400) {
  start();
  for (const bool split : {false, true}) {
    HttpClient c;
    ASSERT_EQ(c.connect("127.0.0.1", server_.port(), 5s), "");
    if (split) {
      ASSERT_EQ(c.send_raw("GET /hello HTTP/1.1\r\nHost: a\r\nX-A: b\r\n"), "");
      EXPECT_FALSE(c.read_response(100ms).ok());  // nothing yet: headers incomplete
      ASSERT_EQ(c.send_raw(" c\r\n\r\n"), "");
    } else {
      ASSERT_EQ(c.send_raw("GET /hello HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n 0\r\n\r\n"), "");
    }
    HttpResponse r = c.read_response(5s);
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.status, 400) << "split=" << split << " body: " << r.body;
    EXPECT_NE(r.body.find("obs-fold"), std::string::npos) << r.body;
  }
  EXPECT_EQ(server_.stats().bad_requests.load(), 2u);
  // Ordinary requests, also split at every line end, still pass.
  HttpClient c;
  ASSERT_EQ(c.connect("127.0.0.1", server_.port(), 5s), "");
  ASSERT_EQ(c.send_raw("GET /hello HTTP/1.1\r\n"), "");
  EXPECT_FALSE(c.read_response(50ms).ok());
  ASSERT_EQ(c.send_raw("Host: a\r\n"), "");
  EXPECT_FALSE(c.read_response(50ms).ok());
  ASSERT_EQ(c.send_raw("X-A:  b\t\r\n\r\n"), "");
  EXPECT_EQ(c.read_response(5s).status, 200);
}

// #10: the listeners use SO_REUSEPORT, yet a second server (or any socket listening with
// SO_REUSEPORT) on the same port must make start() fail, not share the port silently.
TEST_F(HttpBoundsTest, PortSomeoneListensOnIsRefused) {
  start();
  Server second;
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = server_.port();
  Status s = second.start(o, [](Request&&, ResponseWriter w) { w.send(Response::text(200, "second")); });
  EXPECT_FALSE(s.is_ok()) << "a second server shares port " << o.port;
  EXPECT_NE(s.message().find("Address already in use"), std::string::npos) << s.to_string();

  // A foreign socket with SO_REUSEPORT, listening first.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  Server third;
  o.port = ntohs(a.sin_port);
  s = third.start(o, [](Request&&, ResponseWriter w) { w.send(Response::text(200, "third")); });
  EXPECT_FALSE(s.is_ok()) << "the server shares port " << o.port << " with a SO_REUSEPORT socket";
  ::close(fd);

  // A port nobody uses any more (the foreign socket closed) works, including a restart on the
  // same port while the previous run's connections are in TIME_WAIT.
  Server fourth;
  s = fourth.start(o, [](Request&&, ResponseWriter w) { w.send(Response::text(200, "fourth")); });
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  {
    HttpClient c;
    ASSERT_EQ(c.connect("127.0.0.1", o.port, 5s), "");
    EXPECT_EQ(c.request("GET", "/").body, "fourth");
  }
  fourth.stop(1s);
  Server fifth;
  s = fifth.start(o, [](Request&&, ResponseWriter w) { w.send(Response::text(200, "fifth")); });
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  fifth.stop(1s);
}

// accept() failing with EMFILE used to be logged on every retry, and libuv
// retries at once for as long as connections are pending: a hot loop (326,178 log lines in
// 3 s). Now the worker counts the error, closes its listener (which ends libuv's loop), and
// reopens it 100 ms later. Runs in a forked child whose descriptors are exhausted. libuv's own
// reserve-descriptor trick is disabled on the worker loop, as happens when another thread takes
// the descriptor it frees (what made the flood possible).
TEST(HttpAcceptBackoff, OutOfDescriptorsDoesNotSpinAndRecovers) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    {
      Server server;
      ServerOptions o;
      o.host = "127.0.0.1";
      if (!server.start(o, [](Request&&, ResponseWriter w) { w.send(Response::text(200, "ok")); }).is_ok()) {
        ::_exit(20);
      }
      std::promise<void> disabled;
      server.post(0, [&] {
        uv_loop_t* loop = server.loop(0);
        if (loop->emfile_fd >= 0) ::close(loop->emfile_fd);
        loop->emfile_fd = -1;
        disabled.set_value();
      });
      if (disabled.get_future().wait_for(5s) != std::future_status::ready) ::_exit(21);
      std::vector<int> clients;
      for (int i = 0; i < 20; ++i) clients.push_back(::socket(AF_INET, SOCK_STREAM, 0));
      const int probe = ::dup(0);
      rlimit limit{static_cast<rlim_t>(probe + 16), static_cast<rlim_t>(probe + 16)};
      ::close(probe);
      if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(22);
      std::vector<int> filler;
      for (int fd; (fd = ::open("/dev/null", O_RDONLY)) >= 0;) filler.push_back(fd);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(server.port());
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      for (int c : clients) ::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a));
      if (!eventually([&] { return server.stats().accept_errors.load() >= 1; }, 5s)) ::_exit(23);
      // Half a second out of descriptors: one failed accept, then one failed reopen per 100 ms.
      const auto until = Clock::now() + 500ms;
      while (Clock::now() < until) std::this_thread::sleep_for(5ms);
      const uint64_t errors = server.stats().accept_errors.load();
      for (int c : clients) ::close(c);
      for (int fd : filler) ::close(fd);
      if (errors > 50) ::_exit(24);
      // Descriptors are free again: the listener is back and serves.
      bool served = eventually([&] {
        HttpClient c;
        if (!c.connect("127.0.0.1", server.port(), 1s).empty()) return false;
        return c.request("GET", "/").status == 200;
      }, 10s);
      if (!served) code = 25;
      server.stop(1s);
    }
    ::_exit(code);
  }
  int status = 0;
  const auto until = Clock::now() + scaled(30s);
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < until) std::this_thread::sleep_for(5ms);
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "child hung (a worker spinning on accept errors?)";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "23: no accept error seen, 24: accept errors not throttled, "
                                       "25: not serving after descriptors were freed";
}

}  // namespace
}  // namespace pdr::http
