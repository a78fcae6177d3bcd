// HTTP server tests: real sockets on loopback, port 0, every wait bounded by a deadline.
#include "router/http/http_server.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <uv.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/http_client.h"

namespace pdr::http {
namespace {

using namespace std::chrono_literals;
using pdr::test::HttpClient;
using pdr::test::HttpResponse;
using Clock = std::chrono::steady_clock;

// Counts events from worker threads; the test thread waits for a count with a deadline.
class Counter {
 public:
  void bump() {
    {
      std::lock_guard<std::mutex> l(mu_);
      ++n_;
    }
    cv_.notify_all();
  }
  bool wait_for(int target, std::chrono::milliseconds timeout = 5s) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, timeout, [&] { return n_ >= target; });
  }
  int get() {
    std::lock_guard<std::mutex> l(mu_);
    return n_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_ = 0;
};

std::string error_code_of(const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.contains("error")) return "<not an error body: " + body + ">";
  return j["error"]["code"].is_string() ? j["error"]["code"].get<std::string>() : "null";
}

class HttpServerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    server_.stop(2s);
    std::lock_guard<std::mutex> l(parked_mu_);
    parked_.clear();  // worker threads are joined: no concurrent access left
  }

  void start(ServerOptions options = {}) {
    options.host = "127.0.0.1";
    Status s = server_.start(options, [this](Request&& r, ResponseWriter w) { handle(std::move(r), std::move(w)); });
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    ASSERT_NE(server_.port(), 0);
  }

  HttpClient connect() {
    HttpClient c;
    const std::string err = c.connect("127.0.0.1", server_.port(), 5s);
    EXPECT_EQ(err, "");
    return c;
  }

  // Runs fn on worker `w` and waits for it.
  template <typename Fn>
  auto on_worker(uint32_t w, Fn fn) -> decltype(fn()) {
    auto task = std::make_shared<std::packaged_task<decltype(fn())()>>(std::move(fn));
    auto fut = task->get_future();
    server_.post(w, [task] { (*task)(); });
    EXPECT_EQ(fut.wait_for(5s), std::future_status::ready);
    return fut.get();
  }

  void park(ResponseWriter w) {
    std::lock_guard<std::mutex> l(parked_mu_);
    parked_.push_back(std::move(w));
  }

  void handle(Request&& r, ResponseWriter w) {
    if (r.path == "/hello") {
      w.send(Response::json(200, R"({"hello":"world"})"));
    } else if (r.path == "/echo") {
      Response resp = Response::text(200, r.body);
      resp.headers.push_back({"X-Method", r.method});
      resp.headers.push_back({"X-Query", r.query});
      resp.headers.push_back({"X-Test", std::string(r.header("x-test").value_or("none"))});
      w.send(std::move(resp));
    } else if (r.path == "/stream") {
      w.start_stream(200, {{"Content-Type", "text/event-stream"}});
      w.write("data: 1\n\n");
      w.write("data: 2\n\n");
      w.write("data: [DONE]\n\n");
      w.end_stream();
    } else if (r.path == "/big") {
      // 16 MiB in 1 MiB chunks without waiting: most of it stays buffered until the client reads.
      w.start_stream(200, {});
      const std::string mib(1 << 20, 'x');
      for (int i = 0; i < 16; ++i) w.write(mib);
      big_buffered_ = w.buffered_bytes();
      // The callback owns the writer; the server drops callbacks when the response completes or
      // the connection closes, which breaks the writer -> connection -> callback cycle.
      auto holder = std::make_shared<ResponseWriter>(std::move(w));
      holder->on_drain([this, holder] {
        drained_.bump();
        holder->end_stream();
      });
    } else if (r.path == "/hang") {
      w.on_client_close([this] { hang_closed_.bump(); });
      park(std::move(w));
      arrived_.bump();
    } else if (r.path == "/deferred") {
      park(std::move(w));
      arrived_.bump();
    } else if (r.path == "/from-close-callback") {
      // Answers from a uv close callback, which runs after the loop's check phase: only the
      // flush's idle handle keeps the next poll from blocking on a loop with nothing else to do.
      struct Closing {
        uv_idle_t handle{};
        ResponseWriter writer;
      };
      auto* closing = new Closing{{}, std::move(w)};
      uv_idle_init(server_.loop(r.worker), &closing->handle);
      closing->handle.data = closing;
      uv_close(reinterpret_cast<uv_handle_t*>(&closing->handle), [](uv_handle_t* h) {
        auto* c = static_cast<Closing*>(h->data);
        c->writer.send(Response::text(200, "closed"));
        delete c;
      });
    } else if (r.path == "/whoami") {
      w.send(Response::text(200, std::to_string(r.worker)));
    } else if (r.path == "/throw") {
      throw std::runtime_error("boom");
    } else if (r.path == "/drop") {
      // Writer dropped without a response.
    } else {
      w.send(error_response(404, "no route for " + r.path, "invalid_request_error", "not_found"));
    }
  }

  Server server_;
  std::mutex parked_mu_;
  std::vector<ResponseWriter> parked_;
  Counter arrived_;
  Counter hang_closed_;
  Counter drained_;
  std::atomic<size_t> big_buffered_{0};
};

TEST(JsonErrorTest, EscapesAndShape) {
  Response r = error_response(400, "bad \"quote\" \\ back\nline\x01 ü", "invalid_request_error", "bad_request");
  EXPECT_EQ(r.status, 400);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].value, "application/json");
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["error"]["message"], "bad \"quote\" \\ back\nline\x01 ü");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["code"], "bad_request");
  EXPECT_TRUE(nlohmann::json::parse(error_body("m", "t", ""))["error"]["code"].is_null());
}

TEST_F(HttpServerTest, BasicGet) {
  start();
  HttpClient c = connect();
  HttpResponse r = c.request("GET", "/hello");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, R"({"hello":"world"})");
  EXPECT_EQ(r.header("content-type"), "application/json");
  EXPECT_EQ(r.header("content-length"), std::to_string(r.body.size()));
  EXPECT_EQ(r.header("server"), std::string("pdrouter/") + PDR_VERSION);
  EXPECT_TRUE(r.keep_alive);
  HttpResponse nf = c.request("GET", "/nope");
  EXPECT_EQ(nf.status, 404);
  EXPECT_EQ(error_code_of(nf.body), "not_found");
}

TEST_F(HttpServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  start();
  HttpClient c = connect();
  for (int i = 0; i < 5; ++i) {
    HttpResponse r = c.request("POST", "/echo?i=" + std::to_string(i), {{"X-Test", "v"}}, "body" + std::to_string(i));
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.body, "body" + std::to_string(i));
    EXPECT_EQ(r.header("x-query"), "i=" + std::to_string(i));
    EXPECT_EQ(r.header("x-test"), "v");
  }
  EXPECT_EQ(server_.stats().connections_accepted.load(), 1u);
  EXPECT_EQ(server_.stats().requests.load(), 5u);
  EXPECT_EQ(server_.stats().responses_by_class[2].load(), 5u);
}

TEST_F(HttpServerTest, PipelinedRequestsAnsweredInOrder) {
  start();
  HttpClient c = connect();
  const std::string batch = HttpClient::build_request("POST", "/echo", {}, "first") +
                            HttpClient::build_request("POST", "/echo", {}, "second") +
                            HttpClient::build_request("GET", "/hello", {}, "");
  ASSERT_EQ(c.send_raw(batch), "");
  HttpResponse a = c.read_response();
  HttpResponse b = c.read_response();
  HttpResponse h = c.read_response();
  ASSERT_TRUE(a.ok() && b.ok() && h.ok()) << a.error << b.error << h.error;
  EXPECT_EQ(a.body, "first");
  EXPECT_EQ(b.body, "second");
  EXPECT_EQ(h.body, R"({"hello":"world"})");
}

TEST_F(HttpServerTest, PipelinedRequestWaitsForDeferredResponse) {
  start();
  HttpClient c = connect();
  ASSERT_EQ(c.send_raw(HttpClient::build_request("GET", "/deferred", {}, "") +
                       HttpClient::build_request("GET", "/hello", {}, "")),
            "");
  ASSERT_TRUE(arrived_.wait_for(1));
  // The worker has processed its input; the second request must not have been dispatched.
  EXPECT_EQ(on_worker(0, [this] { return server_.stats().requests.load(); }), 1u);
  EXPECT_TRUE(on_worker(0, [this] {
    std::lock_guard<std::mutex> l(parked_mu_);
    return parked_.back().send(Response::text(200, "deferred"));
  }));
  HttpResponse a = c.read_response();
  HttpResponse b = c.read_response();
  EXPECT_EQ(a.body, "deferred");
  EXPECT_EQ(b.body, R"({"hello":"world"})");
  EXPECT_EQ(server_.stats().requests.load(), 2u);
}

TEST_F(HttpServerTest, PostWithContentLength) {
  start();
  HttpClient c = connect();
  const std::string body(100000, 'b');
  HttpResponse r = c.request("POST", "/echo", {}, body);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.body, body);
  EXPECT_EQ(r.header("x-method"), "POST");
}

TEST_F(HttpServerTest, ChunkedRequestBody) {
  start();
  HttpClient c = connect();
  ASSERT_EQ(c.send_raw("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                       "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
            "");
  HttpResponse r = c.read_response();
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.body, "hello world");
}

TEST_F(HttpServerTest, ExpectContinue) {
  start();
  HttpClient c = connect();
  ASSERT_EQ(c.send_raw("POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"), "");
  HttpResponse cont = c.read_response();
  ASSERT_TRUE(cont.ok()) << cont.error;
  EXPECT_EQ(cont.status, 100);
  ASSERT_EQ(c.send_raw("hello"), "");
  HttpResponse r = c.read_response();
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "hello");
}

TEST_F(HttpServerTest, HeaderTooLargeIs431AndCloses) {
  ServerOptions o;
  o.max_header_bytes = 1024;
  start(o);
  HttpClient c = connect();
  HttpResponse r = c.request("GET", "/hello", {{"X-Big", std::string(4000, 'a')}});
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 431);
  EXPECT_EQ(r.header("content-type"), "application/json");
  EXPECT_EQ(r.header("connection"), "close");
  EXPECT_EQ(error_code_of(r.body), "header_too_large");
  EXPECT_TRUE(c.read_until_closed(3s).closed);
  EXPECT_EQ(server_.stats().header_too_large.load(), 1u);
  EXPECT_EQ(server_.stats().requests.load(), 0u);
}

TEST_F(HttpServerTest, BodyTooLargeIs413BeforeBodyIsSent) {
  ServerOptions o;
  o.max_body_bytes = 1024;
  start(o);
  HttpClient c = connect();
  // Only the headers: the server must decide from Content-Length alone.
  ASSERT_EQ(c.send_raw("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10485760\r\n\r\n"), "");
  HttpResponse r = c.read_response(3s);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.header("connection"), "close");
  EXPECT_EQ(error_code_of(r.body), "body_too_large");
  EXPECT_TRUE(c.read_until_closed(3s).closed);
  EXPECT_EQ(server_.stats().body_too_large.load(), 1u);
}

TEST_F(HttpServerTest, ChunkedBodyTooLargeIs413) {
  ServerOptions o;
  o.max_body_bytes = 1024;
  start(o);
  HttpClient c = connect();
  const std::string chunk(800, 'c');
  ASSERT_EQ(c.send_raw("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n320\r\n" + chunk +
                       "\r\n320\r\n" + chunk + "\r\n0\r\n\r\n"),
            "");
  HttpResponse r = c.read_response(3s);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 413);
  EXPECT_TRUE(c.read_until_closed(3s).closed);
}

TEST_F(HttpServerTest, GarbageIs400WithParserReason) {
  start();
  HttpClient c = connect();
  ASSERT_EQ(c.send_raw("NOT HTTP\r\n\r\n"), "");
  HttpResponse r = c.read_response(3s);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.header("content-type"), "application/json");
  EXPECT_EQ(r.header("connection"), "close");
  auto j = nlohmann::json::parse(r.body);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("HPE_INVALID_METHOD"), std::string::npos) << r.body;
  EXPECT_TRUE(c.read_until_closed(3s).closed);
  EXPECT_EQ(server_.stats().bad_requests.load(), 1u);
}

TEST_F(HttpServerTest, HeaderReadTimeoutIs408) {
  ServerOptions o;
  o.header_read_timeout = 200ms;
  start(o);
  HttpClient c = connect();
  const auto t0 = Clock::now();
  ASSERT_EQ(c.send_raw("GET /hello HTTP/1.1\r\nHost: x\r\nX-Slow: "), "");
  HttpResponse r = c.read_response(5s);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 408);
  EXPECT_EQ(r.header("connection"), "close");
  EXPECT_EQ(error_code_of(r.body), "request_timeout");
  EXPECT_TRUE(c.read_until_closed(5s).closed);
  const auto elapsed = Clock::now() - t0;
  EXPECT_GE(elapsed, 150ms);
  EXPECT_LT(elapsed, 2s);
  EXPECT_EQ(server_.stats().header_timeouts.load(), 1u);
}

TEST_F(HttpServerTest, IdleKeepAliveConnectionClosedSilently) {
  ServerOptions o;
  o.keep_alive_idle = 200ms;
  start(o);
  HttpClient c = connect();
  ASSERT_EQ(c.request("GET", "/hello").status, 200);
  pdr::test::ReadResult rr = c.read_until_closed(5s);
  EXPECT_TRUE(rr.closed) << rr.error;
  EXPECT_EQ(rr.data, "");
  EXPECT_LT(rr.elapsed, 2s);
  EXPECT_EQ(server_.stats().idle_timeouts.load(), 1u);
  EXPECT_EQ(server_.stats().header_timeouts.load(), 0u);
}

TEST_F(HttpServerTest, ClientDisconnectFiresOnClientCloseOnce) {
  start();
  {
    HttpClient c = connect();
    ASSERT_EQ(c.send_request("GET", "/hang"), "");
    ASSERT_TRUE(arrived_.wait_for(1));
  }  // client closes
  ASSERT_TRUE(hang_closed_.wait_for(1, 5s));
  // Writes after the close are refused and harmless.
  auto [wrote, sent, gone] = on_worker(0, [this] {
    std::lock_guard<std::mutex> l(parked_mu_);
    ResponseWriter& w = parked_.back();
    return std::make_tuple(w.write("late"), w.send(Response::text(200, "late")), w.client_gone());
  });
  EXPECT_FALSE(wrote);
  EXPECT_FALSE(sent);
  EXPECT_TRUE(gone);
  // Registering after the close fires at once.
  on_worker(0, [this] {
    std::lock_guard<std::mutex> l(parked_mu_);
    parked_.back().on_client_close([this] { hang_closed_.bump(); });
    return 0;
  });
  EXPECT_EQ(hang_closed_.get(), 2);
  server_.stop(1s);
  EXPECT_EQ(hang_closed_.get(), 2);
  EXPECT_EQ(server_.stats().client_aborts.load(), 1u);
}

TEST_F(HttpServerTest, StreamUsesChunkedEncoding) {
  start();
  HttpClient c = connect();
  HttpResponse r = c.request("GET", "/stream");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.chunked);
  EXPECT_FALSE(r.header("content-length").has_value());
  EXPECT_EQ(r.header("content-type"), "text/event-stream");
  ASSERT_EQ(r.chunks.size(), 3u);
  EXPECT_EQ(r.chunks[0], "data: 1\n\n");
  EXPECT_EQ(r.chunks[2], "data: [DONE]\n\n");
  EXPECT_EQ(r.body, "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n");
  // Connection still usable after the terminating chunk.
  EXPECT_EQ(c.request("GET", "/hello").status, 200);
}

// Everything a handler queues in one loop turn (head, three events, the terminating chunk)
// leaves in one write.
TEST_F(HttpServerTest, StreamQueuedInOneTurnLeavesInOneWrite) {
  start();
  HttpClient c = connect();
  ASSERT_EQ(c.request("GET", "/hello").status, 200);
  const uint64_t before = server_.stats().output_writes.load();
  HttpResponse r = c.request("GET", "/stream");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.body, "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n");
  EXPECT_EQ(server_.stats().output_writes.load() - before, 1u);
}

// An answer queued outside the loop's poll phase (here from a close callback) is written at once,
// not when the next unrelated event wakes the loop (there is none here: the read would time out).
TEST_F(HttpServerTest, AnswerQueuedFromACloseCallbackIsWrittenAtOnce) {
  start();
  HttpClient c = connect();
  HttpResponse r = c.request("GET", "/from-close-callback");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.body, "closed");
  EXPECT_EQ(c.request("GET", "/hello").status, 200);
}

TEST_F(HttpServerTest, StreamToHttp10ClientIsCloseDelimited) {
  start();
  HttpClient c = connect();
  ASSERT_EQ(c.send_raw("GET /stream HTTP/1.0\r\n\r\n"), "");
  HttpResponse r = c.read_response();
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_FALSE(r.chunked);
  EXPECT_EQ(r.header("connection"), "close");
  EXPECT_EQ(r.body, "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n");
}

TEST_F(HttpServerTest, BackPressureDrainCallback) {
  start();
  HttpClient c = connect();
  ASSERT_EQ(c.send_request("GET", "/big"), "");
  HttpResponse r = c.read_response(20s);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.body.size(), 16u << 20);
  EXPECT_GE(big_buffered_.load(), ResponseWriter::kDrainLowWater);
  EXPECT_EQ(drained_.get(), 1);
}

TEST_F(HttpServerTest, Http10KeepAliveAndClose) {
  start();
  {
    HttpClient c = connect();
    ASSERT_EQ(c.send_raw("GET /hello HTTP/1.0\r\n\r\n"), "");
    HttpResponse r = c.read_response();
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.header("connection"), "close");
    EXPECT_TRUE(c.read_until_closed(3s).closed);
  }
  HttpClient c = connect();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(c.send_raw("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"), "");
    HttpResponse r = c.read_response();
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.header("connection"), "keep-alive");
  }
  EXPECT_EQ(server_.stats().connections_accepted.load(), 2u);
}

TEST_F(HttpServerTest, HeadHasNoBody) {
  start();
  HttpClient c = connect();
  HttpResponse r = c.request("HEAD", "/hello");
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.header("content-length"), "17");
  EXPECT_EQ(r.body, "");
  // If body bytes had been sent they would corrupt this response.
  HttpResponse next = c.request("GET", "/hello");
  ASSERT_TRUE(next.ok()) << next.error;
  EXPECT_EQ(next.body, R"({"hello":"world"})");
}

TEST_F(HttpServerTest, HandlerThrowOrDropGives500) {
  start();
  HttpClient c = connect();
  HttpResponse thrown = c.request("GET", "/throw");
  ASSERT_TRUE(thrown.ok()) << thrown.error;
  EXPECT_EQ(thrown.status, 500);
  EXPECT_EQ(error_code_of(thrown.body), "internal_error");
  HttpResponse dropped = c.request("GET", "/drop");
  EXPECT_EQ(dropped.status, 500);
  EXPECT_EQ(c.request("GET", "/hello").status, 200);  // connection survives
  EXPECT_EQ(server_.stats().handler_errors.load(), 2u);
}

TEST_F(HttpServerTest, StopDrainsInFlightRequestAndRefusesNewConnections) {
  start();
  HttpClient idle = connect();
  ASSERT_EQ(idle.request("GET", "/hello").status, 200);
  HttpClient busy = connect();
  ASSERT_EQ(busy.send_request("GET", "/deferred"), "");
  ASSERT_TRUE(arrived_.wait_for(1));

  const auto t0 = Clock::now();
  std::thread stopper([this] { server_.stop(10s); });
  // Wait (bounded) until the listener is gone: new connections are refused.
  bool refused = false;
  while (Clock::now() - t0 < 5s) {
    HttpClient probe;
    if (!probe.connect("127.0.0.1", server_.port(), 1s).empty()) {
      refused = true;
      break;
    }
    std::this_thread::yield();
  }
  EXPECT_TRUE(refused);
  // The idle keep-alive connection is closed.
  EXPECT_TRUE(idle.read_until_closed(3s).closed);
  // The in-flight request still completes, with Connection: close.
  server_.post(0, [this] {
    std::lock_guard<std::mutex> l(parked_mu_);
    parked_.back().send(Response::text(200, "finished during drain"));
  });
  HttpResponse r = busy.read_response(5s);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.body, "finished during drain");
  EXPECT_EQ(r.header("connection"), "close");
  EXPECT_TRUE(busy.read_until_closed(3s).closed);
  busy.close();  // our FIN ends the server's lingering close at once
  stopper.join();
  EXPECT_LT(Clock::now() - t0, 5s);  // returned when drained, not at the 10 s deadline
  EXPECT_EQ(hang_closed_.get(), 0);
  server_.stop(1s);  // idempotent
  bool ran = false;
  server_.post(0, [&ran] { ran = true; });  // dropped after stop
  EXPECT_FALSE(ran);
}

TEST_F(HttpServerTest, StopForceClosesAfterDrainDeadline) {
  start();
  HttpClient c = connect();
  ASSERT_EQ(c.send_request("GET", "/hang"), "");
  ASSERT_TRUE(arrived_.wait_for(1));
  const auto t0 = Clock::now();
  server_.stop(200ms);
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_EQ(hang_closed_.get(), 1);
  EXPECT_TRUE(c.read_until_closed(3s).closed);
}

TEST_F(HttpServerTest, TwoWorkersBothServe) {
  ServerOptions o;
  o.workers = 2;
  start(o);
  ASSERT_EQ(server_.workers(), 2u);
  const auto t0 = on_worker(0, [] { return std::this_thread::get_id(); });
  const auto t1 = on_worker(1, [] { return std::this_thread::get_id(); });
  EXPECT_NE(t0, t1);
  EXPECT_NE(t0, std::this_thread::get_id());
  EXPECT_NE(t1, std::this_thread::get_id());
  // SO_REUSEPORT hashes connections over the two listeners; 64 connections all landing on one
  // worker has probability 2^-63.
  std::set<std::string> seen;
  for (int i = 0; i < 64 && seen.size() < 2; ++i) {
    HttpResponse r = pdr::test::http_request("127.0.0.1", server_.port(), "GET", "/whoami");
    ASSERT_TRUE(r.ok()) << r.error;
    seen.insert(r.body);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"0", "1"}));
}

TEST_F(HttpServerTest, MaxConnectionsRejectsExcess) {
  ServerOptions o;
  o.max_connections = 2;
  start(o);
  HttpClient a = connect();
  HttpClient b = connect();
  ASSERT_EQ(a.request("GET", "/hello").status, 200);
  ASSERT_EQ(b.request("GET", "/hello").status, 200);
  // The excess connection is answered 503 with Retry-After, then closed.
  HttpClient extra = connect();
  pdr::test::ReadResult rr = extra.read_until_closed(3s);
  EXPECT_TRUE(rr.closed) << rr.error;
  EXPECT_TRUE(rr.data.starts_with("HTTP/1.1 503 Service Unavailable\r\n")) << rr.data;
  EXPECT_NE(rr.data.find("\r\nRetry-After: 1\r\n"), std::string::npos) << rr.data;
  EXPECT_NE(rr.data.find("\r\nConnection: close\r\n"), std::string::npos) << rr.data;
  EXPECT_NE(rr.data.find("\"code\":\"too_many_connections\""), std::string::npos) << rr.data;
  EXPECT_EQ(server_.stats().connections_rejected.load(), 1u);
  EXPECT_EQ(server_.stats().busy_refusals.load(), 1u);
  // Capacity returns once a connection closes.
  a.close();
  const auto t0 = Clock::now();
  while (server_.stats().connections_active.load() > 1 && Clock::now() - t0 < 5s) std::this_thread::yield();
  HttpClient d = connect();
  EXPECT_EQ(d.request("GET", "/hello").status, 200);
}

// A budget of request-body bytes: what the server charged, at most `limit` at once.
class TestBudget : public BodyBudget {
 public:
  explicit TestBudget(size_t limit) : limit_(limit) {}
  bool reserve(uint32_t, size_t bytes) override {
    std::lock_guard<std::mutex> l(mu_);
    if (held_ + bytes > limit_) {
      ++refused_;
      return false;
    }
    held_ += bytes;
    peak_ = std::max(peak_, held_);
    return true;
  }
  void release(size_t bytes) override {
    std::lock_guard<std::mutex> l(mu_);
    held_ -= bytes;
  }
  size_t held() { std::lock_guard<std::mutex> l(mu_); return held_; }
  size_t peak() { std::lock_guard<std::mutex> l(mu_); return peak_; }
  int refused() { std::lock_guard<std::mutex> l(mu_); return refused_; }

 private:
  std::mutex mu_;
  size_t limit_, held_ = 0, peak_ = 0;
  int refused_ = 0;
};

// Bodies are charged as they are buffered: a Content-Length body whole before it is read (one
// over the budget is refused unread), a chunked one by its buffer's capacity; the charge is given
// back when the request is done with.
TEST_F(HttpServerTest, BodyBudgetChargesBuffersAndRefusesUnread) {
  TestBudget budget(100000);
  ServerOptions o;
  o.body_budget = &budget;
  start(o);
  HttpClient a = connect();
  HttpResponse r = a.request("POST", "/echo", {}, std::string(60000, 'a'));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.size(), 60000u);
  EXPECT_EQ(budget.peak(), 60000u);
  const auto t0 = Clock::now();
  while (budget.held() != 0 && Clock::now() - t0 < 5s) std::this_thread::yield();
  EXPECT_EQ(budget.held(), 0u);
  // Over the budget: 503 with Retry-After at once, before the body is sent.
  HttpClient b = connect();
  ASSERT_EQ(b.send_raw("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n"), "");
  HttpResponse refused = b.read_response(5s);
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.header("retry-after").value_or(""), "1");
  EXPECT_NE(refused.body.find("memory_budget"), std::string::npos) << refused.body;
  EXPECT_EQ(budget.refused(), 1);
  // Chunked: charged by capacity as the buffer grows, released after.
  HttpClient c = connect();
  std::string chunked = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 10; ++i) chunked += "1000\r\n" + std::string(4096, 'c') + "\r\n";
  chunked += "0\r\n\r\n";
  ASSERT_EQ(c.send_raw(chunked), "");
  r = c.read_response(5s);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body.size(), 40960u);
  EXPECT_GE(budget.peak(), 60000u);
  while (budget.held() != 0 && Clock::now() - t0 < 5s) std::this_thread::yield();
  EXPECT_EQ(budget.held(), 0u);
}

TEST_F(HttpServerTest, StartFailsCleanlyOnBadHost) {
  start();
  Server other;
  ServerOptions o;
  o.host = "not-an-address";
  Status s = other.start(o, [](Request&&, ResponseWriter) {});
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kBadAddress);
}

}  // namespace
}  // namespace pdr::http
