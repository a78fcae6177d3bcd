// Upstream client tests: real sockets on loopback, port 0. The upstream is pdr::http::Server (its
// own worker threads); the client pool runs on a uv loop in the test thread. Every wait is
// bounded by a deadline timer on that loop.
#include "router/http/upstream_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "router/http/http_server.h"
#include "tests/support/time_scale.h"

namespace pdr::http {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using pdr::test::scaled;

constexpr int kSseEvents = 5;
constexpr auto kSseGap = 20ms;

// What one call saw, recorded on the loop thread.
struct Outcome {
  int status = 0;
  std::vector<Header> headers;
  std::string body;
  std::vector<Clock::time_point> chunk_times;
  bool completed = false;
  bool failed = false;
  int finals = 0;  // on_complete + on_error: must end at exactly 1 (0 after cancel)
  int callbacks_after_done = 0;
  Status error;
  Clock::time_point done_at{};

  bool done() const { return finals > 0; }
};

UpstreamCallbacks record_into(Outcome* o) {
  UpstreamCallbacks cb;
  cb.on_head = [o](int status, const std::vector<Header>& headers) {
    if (o->done()) ++o->callbacks_after_done;
    o->status = status;
    o->headers = headers;
  };
  cb.on_body = [o](std::string_view chunk) {
    if (o->done()) ++o->callbacks_after_done;
    o->body.append(chunk);
    o->chunk_times.push_back(Clock::now());
  };
  cb.on_complete = [o] {
    ++o->finals;
    o->completed = true;
    o->done_at = Clock::now();
  };
  cb.on_error = [o](const Status& s) {
    ++o->finals;
    o->failed = true;
    o->error = s;
    o->done_at = Clock::now();
  };
  return cb;
}

std::string header_of(const Outcome& o, std::string_view name) {
  for (const Header& h : o.headers) {
    if (iequals(h.name, name)) return h.value;
  }
  return "<none>";
}

// Sends SSE events from a timer on the worker loop that ran the handler.
struct SseStreamer {
  uv_timer_t timer{};
  ResponseWriter writer;
  int sent = 0;
  std::atomic<int64_t>* last_sent_ns = nullptr;

  static void tick(uv_timer_t* t) {
    auto* s = static_cast<SseStreamer*>(t->data);
    ++s->sent;
    s->writer.write("data: {\"event\":" + std::to_string(s->sent) + "}\n\n");
    if (s->sent == kSseEvents) {
      s->last_sent_ns->store(Clock::now().time_since_epoch().count());
      s->writer.end_stream();
      uv_timer_stop(t);
      uv_close(reinterpret_cast<uv_handle_t*>(t), [](uv_handle_t* h) { delete static_cast<SseStreamer*>(h->data); });
    }
  }
};

class UpstreamClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(uv_loop_init(&loop_), 0);
    uv_timer_init(&loop_, &deadline_);
    uv_timer_init(&loop_, &tick_);
    deadline_.data = this;
    pool_ = std::make_unique<UpstreamPool>(&loop_, PoolOptions{});
  }

  void TearDown() override {
    pool_.reset();
    uv_close(reinterpret_cast<uv_handle_t*>(&deadline_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&tick_), nullptr);
    // Handles finish closing on the loop; a clean uv_loop_close proves nothing was left open.
    const auto until = Clock::now() + 5s;
    while (uv_loop_alive(&loop_) && Clock::now() < until) uv_run(&loop_, UV_RUN_NOWAIT);
    EXPECT_EQ(uv_loop_close(&loop_), 0) << "handles left open on the client loop";
    server_.stop(1s);
    std::lock_guard<std::mutex> l(parked_mu_);
    parked_.clear();  // worker threads are joined
  }

  void start_server(ServerOptions options = {}) {
    if (options.host == "0.0.0.0") options.host = "127.0.0.1";
    Status s = server_.start(options, [this](Request&& r, ResponseWriter w) { handle(std::move(r), std::move(w)); });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    target_ = proto::HostPort{options.host, server_.port()};
  }

  void handle(Request&& r, ResponseWriter w) {
    requests_.fetch_add(1);
    if (r.path == "/json") {
      Response resp = Response::json(200, R"({"object":"text_completion","echo":")" + r.body + "\"}");
      resp.headers.push_back({"X-Host", std::string(r.header("host").value_or("none"))});
      resp.headers.push_back({"X-Connection", std::string(r.header("connection").value_or("none"))});
      resp.headers.push_back({"X-Test", std::string(r.header("x-test").value_or("none"))});
      resp.headers.push_back({"X-Method", r.method});
      w.send(std::move(resp));
    } else if (r.path == "/sse") {
      w.start_stream(200, {{"Content-Type", "text/event-stream"}});
      auto* s = new SseStreamer;
      s->writer = std::move(w);
      s->last_sent_ns = &sse_last_sent_ns_;
      s->timer.data = s;
      uv_timer_init(server_.loop(r.worker), &s->timer);
      const auto gap = static_cast<uint64_t>(kSseGap.count());
      uv_timer_start(&s->timer, &SseStreamer::tick, gap, gap);
    } else if (r.path == "/sse-then-silence") {  // one event, then nothing (the stream stays open)
      w.start_stream(200, {{"Content-Type", "text/event-stream"}});
      w.write("data: 1\n\n");
      std::lock_guard<std::mutex> l(parked_mu_);
      parked_.push_back(std::move(w));
    } else if (r.path == "/hang") {
      w.on_client_close([this] { hang_closed_.fetch_add(1); });
      std::lock_guard<std::mutex> l(parked_mu_);
      parked_.push_back(std::move(w));
      hang_arrived_.fetch_add(1);
    } else {
      w.send(Response::text(404, "no route"));
    }
  }

  // Runs the client loop until pred() holds or the deadline passes. A 2 ms tick keeps the loop
  // waking up so conditions set by server threads are noticed.
  bool run_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout = 5s) {
    expired_ = false;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(scaled(timeout)).count();
    uv_timer_start(&deadline_, [](uv_timer_t* t) { static_cast<UpstreamClientTest*>(t->data)->expired_ = true; },
                   static_cast<uint64_t>(ms), 0);
    uv_timer_start(&tick_, [](uv_timer_t*) {}, 2, 2);
    bool ok = pred();
    while (!ok && !expired_) {
      uv_run(&loop_, UV_RUN_ONCE);
      ok = pred();
    }
    uv_timer_stop(&deadline_);
    uv_timer_stop(&tick_);
    return ok;
  }

  std::shared_ptr<UpstreamCall> call(std::string path, Outcome* o, UpstreamTimeouts t = {},
                                     std::string body = "") {
    UpstreamRequest req;
    req.path = std::move(path);
    req.body = std::move(body);
    req.headers.push_back({"Content-Type", "application/json"});
    req.headers.push_back({"X-Test", "yes"});
    return pool_->start(target_, std::move(req), t, record_into(o));
  }

  uv_loop_t loop_{};
  std::unique_ptr<UpstreamPool> pool_;
  Server server_;
  proto::HostPort target_;
  std::atomic<int> requests_{0};
  std::atomic<int> hang_arrived_{0};
  std::atomic<int> hang_closed_{0};
  std::atomic<int64_t> sse_last_sent_ns_{0};
  std::mutex parked_mu_;
  std::vector<ResponseWriter> parked_;
  uv_timer_t deadline_{};
  uv_timer_t tick_{};
  bool expired_ = false;
};

// A loopback port nothing listens on: bound, then closed.
uint16_t closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// One-shot raw upstream on a thread: accepts one connection, reads the request head, writes
// `response` verbatim and closes. For framings pdr::http::Server never produces.
class RawUpstream {
 public:
  explicit RawUpstream(std::string response) : response_(std::move(response)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(fd_, 4);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      timeval tv{5, 0};
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      std::string in;
      char buf[4096];
      while (in.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = ::recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        in.append(buf, static_cast<size_t>(n));
      }
      ::send(c, response_.data(), response_.size(), MSG_NOSIGNAL);
      ::close(c);
    });
  }
  ~RawUpstream() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  uint16_t port() const { return port_; }

 private:
  std::string response_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
};

TEST_F(UpstreamClientTest, JsonResponseWithRequestFraming) {
  start_server();
  Outcome o;
  auto c = call("/json", &o, {}, "hi");
  EXPECT_FALSE(o.done()) << "no callback may run inside start()";
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  ASSERT_TRUE(o.completed) << o.error.to_string();
  EXPECT_EQ(o.finals, 1);
  EXPECT_EQ(o.status, 200);
  EXPECT_EQ(o.body, R"({"object":"text_completion","echo":"hi"})");
  EXPECT_EQ(header_of(o, "content-type"), "application/json");
  EXPECT_EQ(header_of(o, "x-host"), "127.0.0.1:" + std::to_string(server_.port()));
  EXPECT_EQ(header_of(o, "x-connection"), "keep-alive");
  EXPECT_EQ(header_of(o, "x-test"), "yes");
  EXPECT_EQ(header_of(o, "x-method"), "POST");
  EXPECT_TRUE(c->done());
  EXPECT_EQ(c->failure(), UpstreamFailure::kNone);
  const PoolStats st = pool_->stats();
  EXPECT_EQ(st.connects, 1u);
  EXPECT_EQ(st.active, 0u);
  EXPECT_EQ(st.idle, 1u);
}

TEST_F(UpstreamClientTest, SseChunksArriveAsTheyAreSent) {
  start_server();
  Outcome o;
  auto c = call("/sse", &o);
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  ASSERT_TRUE(o.completed) << o.error.to_string();
  EXPECT_EQ(header_of(o, "content-type"), "text/event-stream");
  std::string expected;
  for (int i = 1; i <= kSseEvents; ++i) expected += "data: {\"event\":" + std::to_string(i) + "}\n\n";
  EXPECT_EQ(o.body, expected);
  ASSERT_GE(o.chunk_times.size(), 2u) << "the stream was delivered in one piece";
  // Events are 20 ms apart: the first must reach on_body well before the last is sent.
  const auto lead = o.done_at - o.chunk_times.front();
  EXPECT_GE(lead, 60ms) << "first chunk arrived only "
                        << std::chrono::duration_cast<std::chrono::milliseconds>(lead).count()
                        << " ms before completion";
  const Clock::time_point last_sent{Clock::duration(sse_last_sent_ns_.load())};
  EXPECT_LT(o.chunk_times.front(), last_sent);
  EXPECT_EQ(pool_->stats().idle, 1u);  // chunked response: reusable
}

TEST_F(UpstreamClientTest, FirstByteTimeout) {
  start_server();
  Outcome o;
  UpstreamTimeouts t;
  t.first_byte = 100ms;
  const auto t0 = Clock::now();
  auto c = call("/hang", &o, t);
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  EXPECT_TRUE(o.failed);
  EXPECT_EQ(o.error.code(), StatusCode::kIoError);
  EXPECT_NE(o.error.message().find("timeout"), std::string::npos) << o.error.message();
  EXPECT_EQ(c->failure(), UpstreamFailure::kFirstByteTimeout);
  EXPECT_TRUE(is_timeout(c->failure()));
  EXPECT_GE(o.done_at - t0, 99ms);  // libuv's loop clock has millisecond granularity
  EXPECT_EQ(pool_->stats().timeouts, 1u);
  EXPECT_EQ(pool_->stats().idle, 0u);
  // The timed-out connection was closed: the upstream sees the client go.
  EXPECT_TRUE(run_until([&] { return hang_closed_.load() == 1; }));
}

// A connection's timer runs lazily (a later deadline does not re-arm libuv's timer): a first-byte
// timeout on a pooled connection fires at its own deadline whether the pool idle time armed
// before it is shorter (the timer fires early and re-arms for the rest) or longer (the timer is
// re-armed earlier).
TEST_F(UpstreamClientTest, FirstByteTimeoutOnAPooledConnectionKeepsItsDeadline) {
  start_server();
  for (const auto& [pool_idle, first_byte] : {std::pair{150ms, 500ms}, std::pair{20000ms, 100ms}}) {
    PoolOptions options;
    options.idle_timeout = pool_idle;
    pool_ = std::make_unique<UpstreamPool>(&loop_, options);
    Outcome first;
    auto c1 = call("/json", &first);
    ASSERT_TRUE(run_until([&] { return first.done(); }));
    ASSERT_TRUE(first.completed) << first.error.to_string();
    ASSERT_EQ(pool_->stats().idle, 1u);
    Outcome o;
    UpstreamTimeouts t;
    t.first_byte = first_byte;
    const auto t0 = Clock::now();
    auto c2 = call("/hang", &o, t);
    ASSERT_TRUE(run_until([&] { return o.done(); }));
    EXPECT_TRUE(c2->reused_connection());
    EXPECT_EQ(c2->failure(), UpstreamFailure::kFirstByteTimeout) << o.error.to_string();
    EXPECT_GE(o.done_at - t0, first_byte - 1ms);  // libuv's loop clock has millisecond granularity
    if (pool_idle > first_byte) {
      EXPECT_LT(o.done_at - t0, pool_idle / 4) << "the timeout waited for the pool idle timer";
    }
  }
}

TEST_F(UpstreamClientTest, CancelClosesTheConnectionAndSilencesCallbacks) {
  start_server();
  Outcome o;
  auto c = call("/hang", &o);
  ASSERT_TRUE(run_until([&] { return hang_arrived_.load() == 1; }));
  c->cancel();
  EXPECT_TRUE(c->done());
  ASSERT_TRUE(run_until([&] { return hang_closed_.load() == 1; })) << "upstream never saw the close";
  c->cancel();  // idempotent
  run_until([] { return false; }, 50ms);
  EXPECT_EQ(o.finals, 0);
  EXPECT_EQ(o.status, 0);
  const PoolStats st = pool_->stats();
  EXPECT_EQ(st.cancels, 1u);
  EXPECT_EQ(st.active, 0u);
  EXPECT_EQ(st.idle, 0u);
}

TEST_F(UpstreamClientTest, CancelFromOnHeadStopsTheBody) {
  start_server();
  Outcome o;
  std::shared_ptr<UpstreamCall> c;
  UpstreamCallbacks cb = record_into(&o);
  cb.on_head = [&](int status, const std::vector<Header>&) {
    o.status = status;
    c->cancel();
  };
  UpstreamRequest req;
  req.path = "/sse";
  c = pool_->start(target_, std::move(req), {}, std::move(cb));
  ASSERT_TRUE(run_until([&] { return o.status != 0; }));
  run_until([] { return false; }, 150ms);
  EXPECT_EQ(o.finals, 0);
  EXPECT_TRUE(o.body.empty());
  EXPECT_EQ(pool_->stats().cancels, 1u);
}

TEST_F(UpstreamClientTest, ConnectionRefusedFailsQuickly) {
  start_server();
  Outcome o;
  target_.port = closed_port();
  const auto t0 = Clock::now();
  auto c = call("/json", &o);
  ASSERT_TRUE(run_until([&] { return o.done(); }, 2s));
  EXPECT_TRUE(o.failed);
  EXPECT_EQ(c->failure(), UpstreamFailure::kConnect);
  EXPECT_NE(o.error.message().find("refused"), std::string::npos) << o.error.message();
  EXPECT_LT(o.done_at - t0, scaled(1s));
  EXPECT_EQ(pool_->stats().errors, 1u);
}

// Connect timeout without a non-routable address: a loopback listener that never accepts, with
// backlog 0 and its accept queue filled, drops further SYNs, so the connect hangs.
TEST_F(UpstreamClientTest, ConnectTimeoutAgainstFullBacklog) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(lfd, 0), 0);
  socklen_t len = sizeof(a);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  std::vector<int> fillers;
  for (int i = 0; i < 4; ++i) {
    const int f = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ::connect(f, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    fillers.push_back(f);
  }
  Outcome o;
  target_ = proto::HostPort{"127.0.0.1", ntohs(a.sin_port)};
  UpstreamTimeouts t;
  t.connect = 150ms;
  t.first_byte = 10s;
  auto c = call("/json", &o, t);
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  EXPECT_TRUE(o.failed);
  EXPECT_EQ(c->failure(), UpstreamFailure::kConnectTimeout) << o.error.to_string();
  EXPECT_NE(o.error.message().find("timeout"), std::string::npos);
  for (int f : fillers) ::close(f);
  ::close(lfd);
}

TEST_F(UpstreamClientTest, KeepAliveReuse) {
  start_server();
  Outcome first, second;
  auto c1 = call("/json", &first, {}, "1");
  ASSERT_TRUE(run_until([&] { return first.done(); }));
  auto c2 = call("/json", &second, {}, "2");
  ASSERT_TRUE(run_until([&] { return second.done(); }));
  ASSERT_TRUE(first.completed && second.completed) << second.error.to_string();
  EXPECT_FALSE(c1->reused_connection());
  EXPECT_TRUE(c2->reused_connection());
  const PoolStats st = pool_->stats();
  EXPECT_EQ(st.connects, 1u);
  EXPECT_EQ(st.reuses, 1u);
  EXPECT_EQ(st.retries, 0u);
  EXPECT_EQ(server_.stats().connections_accepted.load(), 1u);
}

TEST_F(UpstreamClientTest, StartFromOnCompleteReusesTheConnection) {
  start_server();
  Outcome first, second;
  std::shared_ptr<UpstreamCall> c2;
  UpstreamCallbacks cb = record_into(&first);
  auto done = cb.on_complete;
  cb.on_complete = [&, done] {
    done();
    c2 = call("/json", &second);
  };
  UpstreamRequest req;
  req.path = "/json";
  auto c1 = pool_->start(target_, std::move(req), {}, std::move(cb));
  ASSERT_TRUE(run_until([&] { return second.done(); }));
  EXPECT_TRUE(second.completed);
  EXPECT_TRUE(c2->reused_connection());
  EXPECT_EQ(pool_->stats().connects, 1u);
}

// The upstream closes a pooled connection while the client loop is not running, so the pool has
// not seen the FIN when the next call takes the connection: the call must retry once.
TEST_F(UpstreamClientTest, StalePooledConnectionIsRetriedOnce) {
  ServerOptions opt;
  opt.keep_alive_idle = 100ms;
  start_server(opt);
  Outcome first, second;
  auto c1 = call("/json", &first);
  ASSERT_TRUE(run_until([&] { return first.done(); }));
  ASSERT_EQ(pool_->stats().idle, 1u);
  const auto until = Clock::now() + scaled(5s);
  while (server_.stats().idle_timeouts.load() == 0 && Clock::now() < until) {
    std::this_thread::sleep_for(1ms);  // polling a condition with a deadline, not timing
  }
  ASSERT_EQ(server_.stats().idle_timeouts.load(), 1u);
  auto c2 = call("/json", &second, {}, "again");
  ASSERT_TRUE(run_until([&] { return second.done(); }));
  ASSERT_TRUE(second.completed) << second.error.to_string();
  EXPECT_EQ(second.body, R"({"object":"text_completion","echo":"again"})");
  EXPECT_TRUE(c2->retried());
  const PoolStats st = pool_->stats();
  EXPECT_EQ(st.reuses, 1u);
  EXPECT_EQ(st.retries, 1u);
  EXPECT_EQ(st.connects, 2u);
  EXPECT_EQ(st.errors, 0u);
}

TEST_F(UpstreamClientTest, IdlePooledConnectionClosedByUpstreamIsDropped) {
  ServerOptions opt;
  opt.keep_alive_idle = 50ms;
  start_server(opt);
  Outcome first, second;
  auto c1 = call("/json", &first);
  ASSERT_TRUE(run_until([&] { return first.done(); }));
  ASSERT_TRUE(run_until([&] { return pool_->stats().idle == 0; })) << "pool kept a closed connection";
  auto c2 = call("/json", &second);
  ASSERT_TRUE(run_until([&] { return second.done(); }));
  EXPECT_TRUE(second.completed);
  EXPECT_FALSE(c2->retried());
  EXPECT_EQ(pool_->stats().connects, 2u);
}

TEST_F(UpstreamClientTest, HundredConcurrentCallsKeepAtMostTheIdleCap) {
  ServerOptions opt;
  opt.workers = 2;
  start_server(opt);
  PoolOptions capped;
  capped.max_idle_per_host = 32;
  pool_ = std::make_unique<UpstreamPool>(&loop_, capped);
  constexpr int kCalls = 100;
  std::vector<Outcome> outs(kCalls);
  std::vector<std::shared_ptr<UpstreamCall>> calls;
  for (int i = 0; i < kCalls; ++i) calls.push_back(call("/json", &outs[i], {}, std::to_string(i)));
  ASSERT_TRUE(run_until([&] {
    for (const Outcome& o : outs) {
      if (!o.done()) return false;
    }
    return true;
  }, 10s));
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(outs[i].completed) << i << ": " << outs[i].error.to_string();
    EXPECT_EQ(outs[i].body, R"({"object":"text_completion","echo":")" + std::to_string(i) + "\"}");
    EXPECT_EQ(outs[i].finals, 1);
  }
  const PoolStats st = pool_->stats();
  EXPECT_EQ(st.connects, static_cast<uint64_t>(kCalls));
  EXPECT_EQ(st.active, 0u);
  EXPECT_EQ(st.idle, 32u);  // the other 68 were closed as they finished
}

TEST_F(UpstreamClientTest, CloseDelimitedBody) {
  RawUpstream raw("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello, close-delimited");
  target_ = proto::HostPort{"127.0.0.1", raw.port()};
  Outcome o;
  auto c = call("/raw", &o);
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  ASSERT_TRUE(o.completed) << o.error.to_string();
  EXPECT_EQ(o.body, "hello, close-delimited");
  EXPECT_EQ(pool_->stats().idle, 0u);
}

TEST_F(UpstreamClientTest, InterimResponseSkippedAndConnectionCloseHonoured) {
  RawUpstream raw(
      "HTTP/1.1 100 Continue\r\n\r\n"
      "HTTP/1.1 201 Created\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
  target_ = proto::HostPort{"127.0.0.1", raw.port()};
  Outcome o;
  auto c = call("/raw", &o);
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  ASSERT_TRUE(o.completed) << o.error.to_string();
  EXPECT_EQ(o.status, 201);
  EXPECT_EQ(o.body, "hello world");
  EXPECT_EQ(pool_->stats().idle, 0u);
}

// only_content_type: on_head gets the Content-Type header alone, wherever it is in the head and
// however its value is spelled; the framing headers still work (the parser reads them itself).
TEST_F(UpstreamClientTest, OnlyContentTypeHeaderIsKept) {
  const std::string heads[] = {
      "HTTP/1.1 200 OK\r\nServer: raw\r\nCONTENT-type: text/event-stream; charset=utf-8\r\n"
      "X-Other: 1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\nDate: today\r\n"
      "Content-Type: application/json\r\n\r\nhello",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\nX-A: b\r\n\r\n"
      "5\r\nhello\r\n0\r\n\r\n",
  };
  const std::string types[] = {"text/event-stream; charset=utf-8", "application/json", ""};
  for (size_t i = 0; i < 3; ++i) {
    RawUpstream raw(heads[i]);
    target_ = proto::HostPort{"127.0.0.1", raw.port()};
    Outcome o;
    UpstreamRequest req;
    req.path = "/raw";
    req.only_content_type = true;
    auto c = pool_->start(target_, std::move(req), {}, record_into(&o));
    ASSERT_TRUE(run_until([&] { return o.done(); })) << i;
    ASSERT_TRUE(o.completed) << i << ": " << o.error.to_string();
    EXPECT_EQ(o.body, "hello") << i;
    if (types[i].empty()) {
      EXPECT_TRUE(o.headers.empty()) << i;
    } else {
      ASSERT_EQ(o.headers.size(), 1u) << i;
      EXPECT_TRUE(iequals(o.headers[0].name, "content-type")) << i;
      EXPECT_EQ(o.headers[0].value, types[i]) << i;
    }
  }
  // Without it every header is there.
  RawUpstream raw(heads[0]);
  target_ = proto::HostPort{"127.0.0.1", raw.port()};
  Outcome o;
  auto c = call("/raw", &o);
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  EXPECT_EQ(o.headers.size(), 5u);
}

// only_content_type matches names as they arrive, without copying them: a name sharing a prefix
// with Content-Type, or containing it, is not it; the header is passed on as spelled; the
// response-head limits count the skipped headers as before.
TEST_F(UpstreamClientTest, OnlyContentTypeMatchesWholeNamesAndKeepsTheHeadLimits) {
  auto start = [&](const std::string& response, Outcome* o) {
    auto raw = std::make_unique<RawUpstream>(response);
    target_ = proto::HostPort{"127.0.0.1", raw->port()};
    UpstreamRequest req;
    req.path = "/raw";
    req.only_content_type = true;
    auto c = pool_->start(target_, std::move(req), {}, record_into(o));
    EXPECT_TRUE(run_until([&] { return o->done(); }));
    return std::make_pair(std::move(raw), c);
  };
  {
    Outcome o;
    auto [raw, c] = start(
        "HTTP/1.1 200 OK\r\nContent-Typ: a\r\nContent-Types: b\r\nX-Content-Type: c\r\n"
        "content-TYPE: d\r\nContent-Type-2: e\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        &o);
    ASSERT_TRUE(o.completed) << o.error.to_string();
    ASSERT_EQ(o.headers.size(), 1u);
    EXPECT_EQ(o.headers[0].name, "content-TYPE");
    EXPECT_EQ(o.headers[0].value, "d");
    EXPECT_EQ(o.body, "ok");
  }
  std::string flood = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n";
  for (int i = 0; i < 20; ++i) flood += "X-Flood: " + std::string(10000, 'a') + "\r\n";
  std::string many = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n";
  for (int i = 0; i < 150; ++i) many += "X-N" + std::to_string(i) + ": 1\r\n";
  std::string long_names = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n";
  for (int i = 0; i < 20; ++i) long_names += std::string(10000, 'N') + std::to_string(i) + ": 1\r\n";
  const std::pair<std::string, const char*> refused[] = {
      {flood + "\r\nok", "response headers over 65536 bytes"},
      {long_names + "\r\nok", "response headers over 65536 bytes"},
      {many + "\r\nok", "more than 100 response header fields"},
  };
  for (const auto& [response, message] : refused) {
    Outcome o;
    auto [raw, c] = start(response, &o);
    EXPECT_TRUE(o.failed) << message;
    EXPECT_EQ(c->failure(), UpstreamFailure::kBadResponse) << message;
    EXPECT_NE(o.error.message().find(message), std::string::npos) << o.error.message();
  }
  std::string hundred = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n";
  for (int i = 0; i < 98; ++i) hundred += "X-N" + std::to_string(i) + ": 1\r\n";
  Outcome o;
  auto [raw, c] = start(hundred + "\r\nok", &o);
  ASSERT_TRUE(o.completed) << o.error.to_string();
  ASSERT_EQ(o.headers.size(), 1u);
  EXPECT_EQ(o.headers[0].value, "text/plain");
}

TEST_F(UpstreamClientTest, TruncatedResponseIsAnError) {
  RawUpstream raw("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a part");
  target_ = proto::HostPort{"127.0.0.1", raw.port()};
  Outcome o;
  auto c = call("/raw", &o);
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  EXPECT_TRUE(o.failed);
  EXPECT_EQ(c->failure(), UpstreamFailure::kConnectionLost);
  EXPECT_EQ(o.body, "only a part");
  EXPECT_FALSE(c->retried());
}

TEST_F(UpstreamClientTest, MalformedResponseIsAnError) {
  RawUpstream raw("HTTP/1.1 abc\r\n\r\n");
  target_ = proto::HostPort{"127.0.0.1", raw.port()};
  Outcome o;
  auto c = call("/raw", &o);
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  EXPECT_TRUE(o.failed);
  EXPECT_EQ(c->failure(), UpstreamFailure::kBadResponse);
  EXPECT_EQ(o.error.code(), StatusCode::kMalformed);
}

// A node (or anything that registered as one) answering an endless header
// block, too many header fields, or endless 1xx heads must not make the router buffer without
// bound: the call fails as kBadResponse and says which limit.
TEST_F(UpstreamClientTest, ResponseHeadLimits) {
  struct Case {
    const char* name;
    std::string response;
    const char* message;
  };
  std::string flood = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n";
  for (int i = 0; i < 20; ++i) flood += "X-Flood: " + std::string(10000, 'a') + "\r\n";
  flood += "\r\nok";
  std::string many = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n";
  for (int i = 0; i < 150; ++i) many += "X-N" + std::to_string(i) + ": 1\r\n";
  many += "\r\nok";
  std::string interim;
  for (int i = 0; i < 50; ++i) interim += "HTTP/1.1 100 Continue\r\n\r\n";
  interim += "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
  const Case cases[] = {
      {"header bytes", flood, "response headers over 65536 bytes"},
      {"header count", many, "more than 100 response header fields"},
      {"interim responses", interim, "more than 10 interim (1xx) responses"},
  };
  uint64_t refused = 0;
  for (const Case& c : cases) {
    RawUpstream raw(c.response);
    target_ = proto::HostPort{"127.0.0.1", raw.port()};
    Outcome o;
    auto call_handle = call("/raw", &o);
    ASSERT_TRUE(run_until([&] { return o.done(); })) << c.name;
    EXPECT_TRUE(o.failed) << c.name << ": the response was accepted";
    EXPECT_EQ(call_handle->failure(), UpstreamFailure::kBadResponse) << c.name << ": " << o.error.to_string();
    EXPECT_EQ(o.error.code(), StatusCode::kMalformed) << c.name;
    EXPECT_NE(o.error.message().find(c.message), std::string::npos) << c.name << ": " << o.error.message();
    EXPECT_NE(o.error.message().find("refused"), std::string::npos) << o.error.message();
    EXPECT_EQ(o.status, 0) << c.name << ": on_head ran";
    EXPECT_EQ(pool_->stats().oversized_heads, ++refused);
  }
  // At the limits exactly: 100 fields and 10 interim heads are fine.
  std::string hundred = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n";
  for (int i = 0; i < 99; ++i) hundred += "X-N" + std::to_string(i) + ": 1\r\n";
  hundred += "\r\n";
  std::string ten;
  for (int i = 0; i < 10; ++i) ten += "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n";
  for (const std::string& head : {hundred + "ok", ten + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}) {
    RawUpstream raw(head);
    target_ = proto::HostPort{"127.0.0.1", raw.port()};
    Outcome o;
    auto call_handle = call("/raw", &o);
    ASSERT_TRUE(run_until([&] { return o.done(); }));
    EXPECT_TRUE(o.completed) << o.error.to_string();
    EXPECT_EQ(o.body, "ok");
  }
}

// The router running out of file descriptors is its own shortage, not the
// node's: the call fails as kLocalResources (never kConnect, which counts toward ejecting the
// node). Runs in a child process whose RLIMIT_NOFILE is exhausted, so the test process keeps its
// fds. The child is this binary again (fork + exec, PDR_LOCAL_RESOURCES_PORT set) so that it can
// start with UBSan reports non-fatal: UBSan's vptr check opens a pipe to probe memory and, with no
// descriptor left, reports a false "invalid vptr". The child's exit code is the verdict.
int exhausted_descriptors_call(uint16_t port) {
  uv_loop_t loop;
  if (uv_loop_init(&loop) != 0) return 10;
  int code = 11;
  {
    UpstreamPool pool(&loop, PoolOptions{});
    // Lower the limit a little above what is open, then take every descriptor left.
    int probe = ::dup(0);
    rlimit limit{static_cast<rlim_t>(probe + 8), static_cast<rlim_t>(probe + 8)};
    ::close(probe);
    if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return 12;
    while (::open("/dev/null", O_RDONLY) >= 0) {
    }
    if (errno != EMFILE) return 13;
    Outcome o;
    UpstreamRequest req;
    req.path = "/v1/completions";
    auto c = pool.start(proto::HostPort{"127.0.0.1", port}, std::move(req), {}, record_into(&o));
    const auto until = Clock::now() + 5s;
    while (!o.done() && Clock::now() < until) uv_run(&loop, UV_RUN_NOWAIT);
    if (!o.failed) {
      code = 14;
    } else if (c->failure() != UpstreamFailure::kLocalResources) {
      code = c->failure() == UpstreamFailure::kConnect ? 15 : 16;
    } else if (o.error.message().find("not the node") == std::string::npos) {
      code = 17;
    } else if (pool.stats().local_errors != 1) {
      code = 18;
    } else {
      code = 0;
    }
  }
  return code;
}

TEST(UpstreamLocalResources, SocketExhaustionIsALocalFailure) {
  if (const char* child_port = std::getenv("PDR_LOCAL_RESOURCES_PORT")) {
    ::_exit(exhausted_descriptors_call(static_cast<uint16_t>(std::atoi(child_port))));
  }
  const uint16_t port = closed_port();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("PDR_LOCAL_RESOURCES_PORT", std::to_string(port).c_str(), 1);
    ::setenv("UBSAN_OPTIONS", "halt_on_error=0:print_stacktrace=0", 1);
    char self[] = "/proc/self/exe";
    char filter[] = "--gtest_filter=UpstreamLocalResources.SocketExhaustionIsALocalFailure";
    char* argv[] = {self, filter, nullptr};
    ::execv(self, argv);
    ::_exit(20);
  }
  int status = 0;
  const auto until = Clock::now() + scaled(20s);
  pid_t done = 0;
  while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && Clock::now() < until) std::this_thread::sleep_for(5ms);
  if (done == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    FAIL() << "child did not finish";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "14: the call did not fail, 15: it failed as kConnect (blamed on the node), "
                                       "16: another failure, 17: message, 18: local_errors count, 20: exec failed";
}

// A body written straight into the wire buffer (the router's unrendered legs) is framed and
// sent like a given one; a writer that does not write the announced size fails the call.
TEST_F(UpstreamClientTest, BodyWrittenIntoTheWireBuffer) {
  start_server();
  Outcome o, wrong;
  int writes = 0;
  UpstreamRequest req;
  req.path = "/json";
  req.body_size = 2;
  req.append_body = [&writes](std::string* wire) {
    ++writes;
    wire->append("h");
    wire->append("i");
  };
  auto c = pool_->start(target_, std::move(req), {}, record_into(&o));
  EXPECT_EQ(writes, 1) << "written once, inside start()";
  UpstreamRequest bad;
  bad.path = "/json";
  bad.body_size = 3;
  bad.append_body = [](std::string* wire) { wire->append("hi"); };
  auto c2 = pool_->start(target_, std::move(bad), {}, record_into(&wrong));
  ASSERT_TRUE(run_until([&] { return o.done() && wrong.done(); }));
  ASSERT_TRUE(o.completed) << o.error.to_string();
  EXPECT_EQ(o.body, R"({"object":"text_completion","echo":"hi"})");
  EXPECT_EQ(wrong.error.code(), StatusCode::kInvalidValue);
  EXPECT_EQ(c2->failure(), UpstreamFailure::kBadRequest);
  EXPECT_EQ(writes, 1);
}

// Borrowed headers (the router's legs) are sent like given ones, checked the same way, and read
// only inside start(): the caller's storage may go right after it.
TEST_F(UpstreamClientTest, BorrowedHeadersAreSentAndChecked) {
  start_server();
  Outcome o, bad;
  {
    std::vector<std::pair<std::string, std::string>> mine{{"X-Test", "borrowed value"}, {"Host", "ignored"}};
    UpstreamRequest req;
    req.path = "/json";
    req.body = "hi";
    req.borrowed_headers = mine;
    pool_->start(target_, std::move(req), {}, record_into(&o));
    mine = {{"X-Test", "changed after start"}};
    std::vector<std::pair<std::string, std::string>> evil{{"X-Evil", "a\r\nInjected: 1"}};
    UpstreamRequest bad_req;
    bad_req.path = "/json";
    bad_req.borrowed_headers = evil;
    pool_->start(target_, std::move(bad_req), {}, record_into(&bad));
  }
  ASSERT_TRUE(run_until([&] { return o.done() && bad.done(); }));
  ASSERT_TRUE(o.completed) << o.error.to_string();
  EXPECT_EQ(header_of(o, "x-test"), "borrowed value");
  EXPECT_EQ(header_of(o, "x-host"), target_.host + ":" + std::to_string(target_.port));
  EXPECT_EQ(bad.error.code(), StatusCode::kInvalidValue);
}

// The body idle timeout counts from the last byte read: a stream whose events come faster than it
// runs longer than it uncut (reads move the deadline without re-arming the timer each time), and
// a stream that goes silent fails one period after its last byte.
TEST_F(UpstreamClientTest, BodyIdleTimeoutCountsFromTheLastByte) {
  start_server();
  Outcome steady, silent;
  UpstreamTimeouts t;
  t.idle = kSseGap * 4;  // the /sse stream lasts kSseEvents gaps
  call("/sse", &steady, t);
  call("/sse-then-silence", &silent, t);
  ASSERT_TRUE(run_until([&] { return steady.done() && silent.done(); }));
  EXPECT_TRUE(steady.completed) << steady.error.to_string();
  ASSERT_TRUE(silent.failed);
  EXPECT_NE(silent.error.message().find("idle"), std::string::npos) << silent.error.message();
  ASSERT_FALSE(silent.chunk_times.empty());
  EXPECT_GE(silent.done_at - silent.chunk_times.back(), t.idle - 1ms);  // millisecond loop clock
}

TEST_F(UpstreamClientTest, PortZeroAndBadHeaderFailFromTheLoop) {
  start_server();
  Outcome port_zero, bad_header;
  const uint16_t port = target_.port;
  target_.port = 0;
  auto c1 = call("/json", &port_zero);
  target_.port = port;
  UpstreamRequest req;
  req.path = "/json";
  req.headers.push_back({"X-Evil", "a\r\nInjected: 1"});
  auto c2 = pool_->start(target_, std::move(req), {}, record_into(&bad_header));
  EXPECT_FALSE(port_zero.done());
  EXPECT_FALSE(bad_header.done());
  ASSERT_TRUE(run_until([&] { return port_zero.done() && bad_header.done(); }));
  EXPECT_EQ(port_zero.error.code(), StatusCode::kBadAddress);
  EXPECT_EQ(bad_header.error.code(), StatusCode::kInvalidValue);
  EXPECT_EQ(c1->failure(), UpstreamFailure::kBadRequest);
  EXPECT_EQ(requests_.load(), 0);
}

// "localhost" resolves to 127.0.0.1 (and maybe ::1, which the IPv4-first choice skips: the
// server listens on 127.0.0.1 only). Concurrent calls share one lookup; later fresh connections
// use the cached address; Host names the upstream as given.
TEST_F(UpstreamClientTest, HostnamesAreResolvedOnceAndCached) {
  start_server();
  target_.host = "localhost";
  Outcome a, b;
  call("/json", &a);
  call("/json", &b);
  EXPECT_FALSE(a.done());  // never inside start()
  ASSERT_TRUE(run_until([&] { return a.done() && b.done(); }));
  ASSERT_TRUE(a.completed && b.completed) << a.error.to_string() << " / " << b.error.to_string();
  EXPECT_EQ(header_of(a, "x-host"), "localhost:" + std::to_string(target_.port));
  EXPECT_EQ(pool_->stats().name_lookups, 1u);
  EXPECT_EQ(pool_->stats().connects, 2u);
  Outcome more[3];
  for (Outcome& o : more) call("/json", &o);  // two pooled connections, one fresh
  ASSERT_TRUE(run_until([&] { return more[0].done() && more[1].done() && more[2].done(); }));
  for (const Outcome& o : more) EXPECT_TRUE(o.completed) << o.error.to_string();
  EXPECT_EQ(pool_->stats().connects, 3u);
  EXPECT_EQ(pool_->stats().name_lookups, 1u);
}

TEST_F(UpstreamClientTest, UnresolvableNameFailsWithItsReason) {
  start_server();
  target_.host = "no-such-node.invalid";  // RFC 6761: never resolves
  Outcome o;
  auto c = call("/json", &o);
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  EXPECT_TRUE(o.failed);
  EXPECT_EQ(c->failure(), UpstreamFailure::kConnect);
  EXPECT_NE(o.error.message().find("connect to no-such-node.invalid:" + std::to_string(target_.port) +
                                   ": cannot resolve 'no-such-node.invalid'"),
            std::string::npos)
      << o.error.message();
  EXPECT_EQ(pool_->stats().errors, 1u);
  EXPECT_EQ(requests_.load(), 0);
}

// A failed connect forgets the name: the node may have moved, so the next call looks it up again.
TEST_F(UpstreamClientTest, ConnectFailureForgetsTheName) {
  target_ = proto::HostPort{"localhost", closed_port()};
  Outcome first, second;
  call("/json", &first);
  ASSERT_TRUE(run_until([&] { return first.done(); }));
  EXPECT_NE(first.error.message().find("refused"), std::string::npos) << first.error.message();
  call("/json", &second);
  ASSERT_TRUE(run_until([&] { return second.done(); }));
  EXPECT_TRUE(second.failed);
  EXPECT_EQ(pool_->stats().name_lookups, 2u);
}

// Calls waiting for a name: a cancelled one never calls back and never connects; close_all()
// fails the others at once with kPoolClosed.
TEST_F(UpstreamClientTest, CancelAndCloseWhileResolving) {
  start_server();
  target_.host = "localhost";
  Outcome cancelled, closed;
  auto c1 = call("/json", &cancelled);
  auto c2 = call("/json", &closed);
  c1->cancel();
  pool_->close_all();
  EXPECT_EQ(closed.finals, 1);
  EXPECT_EQ(c2->failure(), UpstreamFailure::kPoolClosed);
  ASSERT_TRUE(run_until([&] { return !uv_loop_alive(&loop_) || pool_->stats().active == 0; }));
  // Let the lookup itself finish on the thread pool: it must call nobody back.
  const auto until = Clock::now() + scaled(2s);
  while (Clock::now() < until && uv_run(&loop_, UV_RUN_NOWAIT) != 0) {
  }
  EXPECT_FALSE(uv_loop_alive(&loop_)) << "the lookup did not finish";
  EXPECT_EQ(cancelled.finals, 0);
  EXPECT_EQ(cancelled.callbacks_after_done, 0);
  EXPECT_EQ(closed.finals, 1);
  EXPECT_EQ(pool_->stats().connects, 0u);
  EXPECT_EQ(pool_->stats().cancels, 1u);
  EXPECT_EQ(requests_.load(), 0);
}

// A lookup that gets no answer in time fails the call; libuv's thread pool is held busy so the
// getaddrinfo cannot even start.
TEST_F(UpstreamClientTest, LookupWithoutAnswerTimesOut) {
  start_server();
  PoolOptions options;
  options.resolve_timeout = 100ms;
  pool_ = std::make_unique<UpstreamPool>(&loop_, options);
  const char* size_env = std::getenv("UV_THREADPOOL_SIZE");
  const int threads = size_env != nullptr ? std::max(1, std::atoi(size_env)) : 4;
  // The blockers hold the process-wide pool until released, and must be gone before the test
  // ends (they read `gate`, and later tests need the pool).
  struct Gate {
    std::atomic<bool> open{false};
    int finished = 0;  // after-work callbacks, on the loop
  } gate;
  std::vector<std::unique_ptr<uv_work_t>> blockers;
  for (int i = 0; i < threads; ++i) {
    blockers.push_back(std::make_unique<uv_work_t>());
    blockers.back()->data = &gate;
    uv_queue_work(
        &loop_, blockers.back().get(),
        [](uv_work_t* w) {
          auto* g = static_cast<Gate*>(w->data);
          while (!g->open.load()) std::this_thread::sleep_for(1ms);
        },
        [](uv_work_t* w, int) { ++static_cast<Gate*>(w->data)->finished; });
  }
  target_.host = "localhost";
  Outcome o;
  auto c = call("/json", &o);
  const bool done = run_until([&] { return o.done(); });
  gate.open = true;
  ASSERT_TRUE(run_until([&] { return gate.finished == threads; })) << "blockers still running";
  ASSERT_TRUE(done);
  EXPECT_EQ(c->failure(), UpstreamFailure::kConnect);
  EXPECT_NE(o.error.message().find("cannot resolve 'localhost': no answer within 100 ms"), std::string::npos)
      << o.error.message();
}

TEST_F(UpstreamClientTest, Ipv6Literal) {
  ServerOptions opt;
  opt.host = "::1";
  Status s = server_.start(opt, [this](Request&& r, ResponseWriter w) { handle(std::move(r), std::move(w)); });
  if (!s.is_ok()) GTEST_SKIP() << "no IPv6 loopback: " << s.to_string();
  target_ = proto::HostPort{"::1", server_.port()};
  Outcome o;
  auto c = call("/json", &o);
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  ASSERT_TRUE(o.completed) << o.error.to_string();
  EXPECT_EQ(header_of(o, "x-host"), "[::1]:" + std::to_string(server_.port()));
}

TEST_F(UpstreamClientTest, PauseAndResume) {
  start_server();
  Outcome o;
  std::shared_ptr<UpstreamCall> c;
  UpstreamCallbacks cb = record_into(&o);
  auto body = cb.on_body;
  cb.on_body = [&, body](std::string_view chunk) {
    body(chunk);
    c->pause();
  };
  UpstreamRequest req;
  req.path = "/sse";
  UpstreamTimeouts t;
  t.idle = 50ms;  // stopped while paused, or this would fire
  c = pool_->start(target_, std::move(req), t, std::move(cb));
  ASSERT_TRUE(run_until([&] { return !o.body.empty(); }));
  run_until([] { return false; }, 200ms);  // the whole stream is sent meanwhile
  EXPECT_FALSE(o.done());
  const size_t seen = o.chunk_times.size();
  EXPECT_LT(seen, static_cast<size_t>(kSseEvents));
  while (!o.done()) {
    c->resume();
    ASSERT_TRUE(run_until([&] { return o.done() || o.chunk_times.size() > seen; }));
  }
  EXPECT_TRUE(o.completed) << o.error.to_string();
  EXPECT_EQ(o.body.size(), static_cast<size_t>(kSseEvents) * std::string("data: {\"event\":1}\n\n").size());
}

TEST_F(UpstreamClientTest, PoolDestroyedWithCallInFlight) {
  start_server();
  Outcome o, idle_done;
  auto warm = call("/json", &idle_done);
  ASSERT_TRUE(run_until([&] { return idle_done.done(); }));
  auto c = call("/hang", &o);
  ASSERT_TRUE(run_until([&] { return hang_arrived_.load() == 1; }));
  pool_.reset();
  EXPECT_TRUE(o.failed);
  EXPECT_EQ(c->failure(), UpstreamFailure::kPoolClosed);
  c->cancel();  // safe on a finished call whose pool is gone
  EXPECT_TRUE(run_until([&] { return hang_closed_.load() == 1; }));
}

TEST_F(UpstreamClientTest, StartAfterCloseAllFails) {
  start_server();
  pool_->close_all();
  Outcome o;
  auto c = call("/json", &o);
  EXPECT_FALSE(o.done());
  ASSERT_TRUE(run_until([&] { return o.done(); }));
  EXPECT_EQ(c->failure(), UpstreamFailure::kPoolClosed);
}

}  // namespace
}  // namespace pdr::http
