// SimEngine (node/sim/engine/driver.h): the engine thread that runs the schedulers in
// wall-clock time, driven from other threads as the server drives it.
#include "node/sim/engine/driver.h"

#include <condition_variable>
#include <mutex>
#include <numeric>

#include <gtest/gtest.h>

#include "tests/support/time_scale.h"

namespace pdr::node::sim {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Collects what the engine hands over, from its thread.
class Recorder {
 public:
  void notices(std::vector<EngineNotice> batch) {
    std::lock_guard<std::mutex> lock(mu_);
    for (EngineNotice& n : batch) {
      notices_.push_back(n);
      if (n.kind == EngineNotice::Kind::kToken) token_times_.push_back(Clock::now());
    }
    cv_.notify_all();
  }
  void events(uint32_t rank, std::vector<PrefixCacheChange> changes) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.emplace_back(rank, std::move(changes));
    cv_.notify_all();
  }
  // Waits until pred(notices) holds; false after `timeout`.
  template <typename Pred>
  bool wait(Pred pred, std::chrono::milliseconds timeout = 5s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout * test::time_scale(), [&] { return pred(notices_); });
  }
  std::vector<EngineNotice> all() {
    std::lock_guard<std::mutex> lock(mu_);
    return notices_;
  }
  std::vector<Clock::time_point> token_times() {
    std::lock_guard<std::mutex> lock(mu_);
    return token_times_;
  }
  size_t stored_batches() {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const auto& [rank, changes] : events_) n += !changes.empty() && changes[0].stored ? 1 : 0;
    return n;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<EngineNotice> notices_;
  std::vector<Clock::time_point> token_times_;
  std::vector<std::pair<uint32_t, std::vector<PrefixCacheChange>>> events_;
};

size_t count(const std::vector<EngineNotice>& notices, EngineNotice::Kind kind, uint64_t key) {
  size_t n = 0;
  for (const EngineNotice& x : notices) n += x.kind == kind && x.key == key ? 1 : 0;
  return n;
}

bool finished(const std::vector<EngineNotice>& notices, uint64_t key) {
  for (const EngineNotice& x : notices) {
    if (x.kind == EngineNotice::Kind::kToken && x.key == key && x.finished) return true;
  }
  return false;
}

EngineArrival arrival(uint64_t key, uint32_t prompt, uint32_t max_tokens, uint32_t rank = 0) {
  EngineArrival a;
  a.key = key;
  a.route = static_cast<uint32_t>(key % 3);
  a.rank = rank;
  a.arrival = Clock::now();
  a.spec.prompt.resize(prompt);
  std::iota(a.spec.prompt.begin(), a.spec.prompt.end(), static_cast<uint32_t>(key * 10000));
  a.spec.outputs.assign(max_tokens, 7);
  return a;
}

struct EngineFixture : ::testing::Test {
  Recorder rec;
  std::unique_ptr<SimEngine> engine;

  void start(SimEngineOptions options) {
    engine = std::make_unique<SimEngine>(
        options, [this](std::vector<EngineNotice> n) { rec.notices(std::move(n)); },
        [this](uint32_t rank, std::vector<PrefixCacheChange> c) { rec.events(rank, std::move(c)); });
    ASSERT_TRUE(engine->start().is_ok());
  }
};

TEST_F(EngineFixture, TokensComeOutOneStepApartInOrderAndTheLastIsFinished) {
  SimEngineOptions o;
  o.ranks = 2;
  o.time_scale = 1.0;  // a lone decode step: 7.5 ms
  start(o);
  engine->submit(arrival(1, 32, 5, 0));
  engine->submit(arrival(2, 32, 3, 1));
  ASSERT_TRUE(rec.wait([](const auto& n) { return finished(n, 1) && finished(n, 2); }));
  const std::vector<EngineNotice> notices = rec.all();
  EXPECT_EQ(count(notices, EngineNotice::Kind::kAdmitted, 1), 1u);
  EXPECT_EQ(count(notices, EngineNotice::Kind::kToken, 1), 5u);
  EXPECT_EQ(count(notices, EngineNotice::Kind::kToken, 2), 3u);
  uint32_t next = 0;
  for (const EngineNotice& n : notices) {
    if (n.key != 1) continue;
    EXPECT_EQ(n.route, 1u);
    if (n.kind != EngineNotice::Kind::kToken) continue;
    EXPECT_EQ(n.index, next++);
    EXPECT_EQ(n.finished, n.index == 4);
  }
  // Two ranks stepping side by side: rank 0's 5 tokens took at least 4 decode steps after its
  // prefill step.
  const std::string text = engine->metrics_text();
  EXPECT_NE(text.find("vllm:generation_tokens_total{model_name=\"sim-model\",engine=\"0\"} 5"), std::string::npos)
      << text;
  EXPECT_NE(text.find("vllm:generation_tokens_total{model_name=\"sim-model\",engine=\"1\"} 3"), std::string::npos);
  EXPECT_NE(text.find("vllm:time_to_first_token_seconds_count{model_name=\"sim-model\",engine=\"0\"} 1"),
            std::string::npos);
  EXPECT_GE(rec.stored_batches(), 2u);  // each rank announced its prompt's blocks
}

TEST_F(EngineFixture, StepsTakeTheirModelledTimeScaled) {
  SimEngineOptions o;
  o.time_scale = 2.0;
  start(o);
  const Clock::time_point t0 = Clock::now();
  engine->submit(arrival(1, 10, 11));
  ASSERT_TRUE(rec.wait([](const auto& n) { return finished(n, 1); }));
  const std::vector<Clock::time_point> times = rec.token_times();
  ASSERT_EQ(times.size(), 11u);
  // 11 steps of at least 7.5 ms each, doubled: the engine never runs ahead of its model. (Gaps
  // between single tokens may be shorter: a late wake-up is made up by the next steps.)
  EXPECT_GE(times.back() - t0, 11 * 15ms);
  EXPECT_LT(times.back() - t0, 11 * 15ms + 1s * test::time_scale());
}

TEST_F(EngineFixture, RemoteKvWaitsForTheRealPullAndTheModelledTransfer) {
  SimEngineOptions o;
  o.time_scale = 1.0;
  start(o);
  EngineArrival a = arrival(4, 64, 2);
  a.spec.remote_tokens = 64;
  engine->submit(std::move(a));
  ASSERT_TRUE(rec.wait([](const auto& n) { return count(n, EngineNotice::Kind::kLoadRemote, 4) == 1; }));
  // Nothing comes out before the pull is reported done, however long that takes.
  EXPECT_FALSE(rec.wait([](const auto& n) { return count(n, EngineNotice::Kind::kToken, 4) > 0; }, 30ms));
  engine->remote_kv_ready(4, true);
  ASSERT_TRUE(rec.wait([](const auto& n) { return finished(n, 4); }));
  EXPECT_EQ(count(rec.all(), EngineNotice::Kind::kToken, 4), 2u);
}

TEST_F(EngineFixture, CancelStopsARequestAndFreesItsBlocks) {
  SimEngineOptions o;
  o.time_scale = 1.0;
  start(o);
  engine->submit(arrival(5, 40, 100000));
  ASSERT_TRUE(rec.wait([](const auto& n) { return count(n, EngineNotice::Kind::kToken, 5) >= 2; }));
  engine->cancel(5);
  engine->cancel(99);  // unknown: ignored
  // The engine goes idle: a request submitted after the cancel runs alone and the pool is free.
  engine->submit(arrival(6, 8, 1));
  ASSERT_TRUE(rec.wait([](const auto& n) { return finished(n, 6); }));
  // Commands run in order: nothing of 5's came out once 6 was admitted.
  const std::vector<EngineNotice> notices = rec.all();
  bool admitted_6 = false;
  for (const EngineNotice& n : notices) {
    admitted_6 = admitted_6 || (n.key == 6 && n.kind == EngineNotice::Kind::kAdmitted);
    EXPECT_FALSE(admitted_6 && n.key == 5) << "a token of the cancelled request after the cancel";
  }
  EXPECT_FALSE(finished(notices, 5));
  const nlohmann::json stats = engine->prefix_cache_json();
  EXPECT_EQ(stats["ranks"][0]["running"], 0);
  EXPECT_DOUBLE_EQ(stats["ranks"][0]["kv_cache_usage"].get<double>(), 0.0);
}

TEST_F(EngineFixture, StopWithRequestsInFlightReturns) {
  SimEngineOptions o;
  start(o);
  for (uint64_t key = 1; key <= 50; ++key) engine->submit(arrival(key, 100, 1000));
  ASSERT_TRUE(rec.wait([](const auto& n) { return !n.empty(); }));
  engine->stop();
  engine->submit(arrival(100, 10, 1));  // after stop: dropped
  engine.reset();
}

}  // namespace
}  // namespace pdr::node::sim
