// router/tracing/span_exporter.h against a collector on a thread of the test (a blocking HTTP
// server on 127.0.0.1, port 0) that decodes every export as OTLP/JSON: batching, the bounded
// queue, a collector that refuses, is down or never answers (dropped spans counted, submit never
// waits), and a stop that does not wait for a hung collector. Also under TSan (the exporter's own
// thread against submitting threads).
#include "router/tracing/span_exporter.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "router/tracing/tracer.h"
#include "tests/support/time_scale.h"

namespace pdr::router::tracing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A collector: answers each POST with `status` (0: reads it and never answers).
class TestCollector {
 public:
  explicit TestCollector(int status) : status_(status) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 16), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~TestCollector() {
    stop_ = true;
    thread_.join();
    for (int c : held_) close(c);
    close(fd_);
  }
  uint16_t port() const { return port_; }
  std::vector<nlohmann::json> bodies() {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }
  size_t spans() {
    size_t n = 0;
    for (const auto& b : bodies()) n += b.at("resourceSpans").at(0).at("scopeSpans").at(0).at("spans").size();
    return n;
  }

 private:
  void run() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int c = accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      std::string in;
      char buf[65536];
      size_t need = std::string::npos;
      while (!stop_) {
        pollfd q{c, POLLIN, 0};
        if (poll(&q, 1, 20) <= 0) continue;
        const ssize_t n = recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        in.append(buf, static_cast<size_t>(n));
        const size_t head = in.find("\r\n\r\n");
        if (head == std::string::npos) continue;
        const size_t cl = in.find("Content-Length: ");
        need = head + 4 + std::stoul(in.substr(cl + 16));
        if (in.size() >= need) break;
      }
      if (need == std::string::npos || in.size() < need) {
        close(c);
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        bodies_.push_back(nlohmann::json::parse(in.substr(in.find("\r\n\r\n") + 4)));
      }
      if (status_ == 0) {
        held_.push_back(c);  // never answered
        continue;
      }
      const std::string reply = "HTTP/1.1 " + std::to_string(status_) + " X\r\nContent-Length: 2\r\n\r\n{}";
      (void)!send(c, reply.data(), reply.size(), MSG_NOSIGNAL);
      close(c);
    }
  }

  const int status_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<nlohmann::json> bodies_;
  std::vector<int> held_;
};

proto::Span span(int i) {
  proto::Span s;
  s.trace_id = Tracer::new_trace_id();
  s.span_id = Tracer::new_span_id();
  s.name = "span " + std::to_string(i);
  s.kind = proto::Span::Kind::kInternal;
  s.start_unix_ns = 1;
  s.end_unix_ns = 2;
  return s;
}

ExporterOptions options(uint16_t port) {
  ExporterOptions o;
  o.collector = proto::HostPort{"127.0.0.1", port};
  o.service_name = "exporter-test";
  o.batch = 20ms;
  o.max_batch_spans = 8;
  o.export_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(test::scaled(2s));
  o.first_backoff = 50ms;
  o.max_backoff = 200ms;
  return o;
}

template <typename Pred>
bool eventually(Pred pred, std::chrono::seconds bound = 10s) {
  const auto until = Clock::now() + test::scaled(bound);
  while (Clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

TEST(SpanExporter, SpansFromSeveralThreadsArriveInBatchesAsOtlpJson) {
  TestCollector collector(200);
  SpanExporter exporter;
  ASSERT_TRUE(exporter.start(options(collector.port())).is_ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&exporter, t] {
      for (int i = 0; i < 25; ++i) EXPECT_TRUE(exporter.submit(span(t * 100 + i)));
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(eventually([&] { return collector.spans() == 100; })) << collector.spans();
  for (const auto& body : collector.bodies()) {
    const auto& rs = body.at("resourceSpans").at(0);
    EXPECT_EQ(rs.at("resource").at("attributes").at(0).at("value").at("stringValue"), "exporter-test");
    EXPECT_LE(rs.at("scopeSpans").at(0).at("spans").size(), 8u);  // max_batch_spans
  }
  EXPECT_TRUE(eventually([&] { return exporter.counters().spans_exported.load() == 100; }));
  EXPECT_EQ(exporter.counters().queued.load(), 0u);
  exporter.stop();
}

TEST(SpanExporter, ARefusingCollectorDropsBatchesCountedAndBacksOff) {
  TestCollector collector(503);
  SpanExporter exporter;
  ASSERT_TRUE(exporter.start(options(collector.port())).is_ok());
  for (int i = 0; i < 8; ++i) exporter.submit(span(i));
  ASSERT_TRUE(eventually([&] { return exporter.counters().exports_failed.load() >= 1; }));
  EXPECT_GE(exporter.counters().spans_dropped_export_failed.load(), 8u);
  EXPECT_EQ(exporter.counters().spans_exported.load(), 0u);
  exporter.stop();
}

TEST(SpanExporter, AHungCollectorNeverBlocksSubmitAndTheQueueStaysBounded) {
  TestCollector collector(0);
  ExporterOptions o = options(collector.port());
  o.max_queue_spans = 32;
  o.export_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(test::scaled(30s));
  SpanExporter exporter;
  ASSERT_TRUE(exporter.start(o).is_ok());
  for (int i = 0; i < 8; ++i) exporter.submit(span(i));
  ASSERT_TRUE(eventually([&] { return collector.bodies().size() == 1; }));  // an export hangs now
  const auto start = Clock::now();
  size_t accepted = 0;
  for (int i = 0; i < 1000; ++i) accepted += exporter.submit(span(i)) ? 1 : 0;
  EXPECT_LT(Clock::now() - start, test::scaled(1s));  // never waits for the collector
  EXPECT_EQ(accepted, 32u);
  EXPECT_EQ(exporter.counters().spans_dropped_queue_full.load(), 1000u - 32u);
  EXPECT_LE(exporter.counters().queued.load(), 32u);
  // stop() gives the hung export up at once instead of waiting export_timeout (30 s).
  const auto stopping = Clock::now();
  exporter.stop();
  EXPECT_LT(Clock::now() - stopping, test::scaled(3s));
  EXPECT_EQ(exporter.counters().queued.load(), 0u);
}

TEST(SpanExporter, ACollectorThatIsDownCostsNothingButCounters) {
  const int probe = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(probe, reinterpret_cast<sockaddr*>(&a), &len);
  close(probe);  // nothing listens there now
  SpanExporter exporter;
  ASSERT_TRUE(exporter.start(options(ntohs(a.sin_port))).is_ok());
  for (int i = 0; i < 20; ++i) exporter.submit(span(i));
  ASSERT_TRUE(eventually([&] { return exporter.counters().exports_failed.load() >= 1; }));
  exporter.stop();
  const auto& c = exporter.counters();
  EXPECT_EQ(c.spans_dropped_export_failed.load() + c.spans_dropped_queue_full.load(), 20u);
}

TEST(Tracer, RatioSamplingIsDecidedByTheTraceId) {
  proto::TraceId low{}, high{};
  low[15] = 1;
  for (size_t i = 8; i < 16; ++i) high[i] = 0xff;
  EXPECT_TRUE(Tracer::ratio_samples(low, 0.001));
  EXPECT_FALSE(Tracer::ratio_samples(high, 0.999));
  EXPECT_TRUE(Tracer::ratio_samples(high, 1.0));
  EXPECT_FALSE(Tracer::ratio_samples(low, 0.0));
  int sampled = 0;
  for (int i = 0; i < 10000; ++i) sampled += Tracer::ratio_samples(Tracer::new_trace_id(), 0.25) ? 1 : 0;
  EXPECT_NEAR(sampled, 2500, 300);
}

}  // namespace
}  // namespace pdr::router::tracing
