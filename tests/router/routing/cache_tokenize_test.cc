// The /tokenize call of cache-aware routing (router/routing/cache_tokenize.h) against a fake
// upstream on a real libuv loop run by the test thread: which node gets the prompt, the node's
// outstanding count while the call runs, the whole-call deadline, and the answer's share of the
// buffered-bytes budget. End to end with real processes: tests/integration/test_cache_tokenize.py.
#include "router/routing/cache_tokenize.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "proto/base/snapshot_cell.h"
#include "discovery/config/topology.h"
#include "discovery/instance.h"
#include "router/proxy/proxy_shared.h"
#include "router/proxy/upstream_port.h"
#include "tests/support/router/fake_upstream_port.h"
#include "tests/support/router/test_instances.h"
#include "tests/support/time_scale.h"

namespace pdr::router::routing {
namespace {

using namespace std::chrono_literals;
using discovery::Instance;
using proto::Connector;
using proto::Role;
using proxy::ProxyShared;
using proxy::UpstreamPort;
using proxy::WorkerContext;

using test::FakeCall;
using test::FakePort;
using test::node;


const proto::Labels kTokenizeLabel = {{"serves", "render,tokenize"}};

struct Outcome {
  bool ok = false;
  TokenizeResult why_not{};
  std::vector<uint32_t> tokens;
};

// One worker context on a loop of the test's own.
class TokenizeHarness {
 public:
  explicit TokenizeHarness(std::vector<std::shared_ptr<const Instance>> instances,
                           std::chrono::milliseconds timeout = 10s, uint32_t budget = 1u << 30) {
    EXPECT_EQ(uv_loop_init(&loop_), 0);
    auto topology = std::make_shared<config::Topology>();
    topology->policies.cache_aware.tokenize_by_node = true;
    topology->policies.cache_aware.tokenize_timeout = timeout;
    topology->policies.cache_aware.tokenize_max_answer_bytes = 4096;
    topology->limits.max_buffered_bytes = budget;
    topology_.publish(topology);
    auto snapshot = std::make_shared<discovery::RegistrySnapshot>();
    snapshot->instances = std::move(instances);
    registry_.publish(snapshot);
    shared.registry = &registry_;
    shared.topology = &topology_;
    worker = std::make_unique<WorkerContext>(shared, 0, &loop_, &port);
    proto::JsonLimits limits;
    EXPECT_TRUE(proto::JsonObjectBody::parse_owned(R"({"model":"m","prompt":"a secret prompt"})", limits, &body_)
                    .is_ok());
  }
  ~TokenizeHarness() {
    worker.reset();
    uv_run(&loop_, UV_RUN_DEFAULT);  // the timer queue's handle closes
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  // Starts a call; its outcome lands in *out.
  UpstreamPort::CallPtr start(std::optional<Outcome>* out) {
    return start_tokenize(*worker, body_, "m", "", [out](bool ok, TokenizeResult why, std::vector<uint32_t>&& ids) {
      *out = Outcome{ok, why, std::move(ids)};
    });
  }
  // Runs the loop until `done` or `limit` passes.
  template <typename Done>
  void run_until(Done done, std::chrono::microseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < until) uv_run(&loop_, UV_RUN_NOWAIT);
  }
  uv_loop_t* loop() { return &loop_; }

  ProxyShared shared;
  FakePort port;
  std::unique_ptr<WorkerContext> worker;

 private:
  uv_loop_t loop_{};
  SnapshotCell<discovery::RegistrySnapshot> registry_;
  SnapshotCell<config::Topology> topology_;
  proto::JsonObjectBody body_;
};

// The prompt goes to a node labelled for tokenisation when one is up, else to a prefill the request
// could be paired with; never to a node that is neither (a connector: none node, a decode, a
// prefill without a compatible decode, a node of another model).
TEST(CacheTokenize, OnlyALabelledNodeOrAPairablePrefillSeesThePrompt) {
  auto prefill = node("127.0.0.1", Role::kPrefill, Connector::kNixl);
  auto decode = node("127.0.0.2", Role::kDecode, Connector::kNixl);
  auto render = node("127.0.0.3", Role::kDecode, Connector::kUnknown, {{"serves", "render"}});  // connector: none
  auto lone = node("127.0.0.4", Role::kPrefill, Connector::kMooncake);  // no Mooncake decode
  auto other_model = node("127.0.0.5", Role::kDecode, Connector::kUnknown, kTokenizeLabel, "other");
  {
    TokenizeHarness h({prefill, decode, render, lone, other_model});
    for (int i = 0; i < 20; ++i) {
      std::optional<Outcome> out;
      ASSERT_NE(h.start(&out), nullptr);
      EXPECT_EQ(h.port.calls.back()->target.to_string(), prefill->key) << i;
      h.port.calls.back()->answer(200, R"({"count":1,"max_model_len":8,"tokens":[7]})");
      ASSERT_TRUE(out && out->ok);
    }
  }
  auto tokenizer = node("127.0.0.6", Role::kDecode, Connector::kUnknown, kTokenizeLabel);
  {
    TokenizeHarness h({prefill, decode, render, lone, other_model, tokenizer});
    for (int i = 0; i < 20; ++i) {
      std::optional<Outcome> out;
      ASSERT_NE(h.start(&out), nullptr);
      EXPECT_EQ(h.port.calls.back()->target.to_string(), tokenizer->key) << i;
      EXPECT_EQ(h.port.calls.back()->request.path, "/tokenize");
      h.port.calls.back()->answer(200, R"({"count":1,"max_model_len":8,"tokens":[7]})");
    }
  }
  {
    TokenizeHarness h({decode, render, lone, other_model});  // nobody eligible
    std::optional<Outcome> out;
    EXPECT_EQ(h.start(&out), nullptr);
    EXPECT_TRUE(h.port.calls.empty());
  }
}

// While the call runs it counts in its node's outstanding (what least-loaded choices read), and
// the count is given back however the call ends.
TEST(CacheTokenize, TheCallCountsInItsNodesOutstanding) {
  auto tokenizer = node("127.0.0.6", Role::kDecode, Connector::kUnknown, kTokenizeLabel);
  auto outstanding = [&] { return tokenizer->liveness->outstanding.load(); };
  TokenizeHarness h({tokenizer}, 100ms);
  std::optional<Outcome> out;
  h.start(&out);
  EXPECT_EQ(outstanding(), 1u);
  h.port.calls.back()->answer(200, R"({"tokens":[1,2]})");
  EXPECT_EQ(outstanding(), 0u);
  ASSERT_TRUE(out && out->ok);
  EXPECT_EQ(out->tokens, (std::vector<uint32_t>{1, 2}));

  out.reset();
  h.start(&out);
  h.port.calls.back()->fail();
  EXPECT_EQ(outstanding(), 0u);
  ASSERT_TRUE(out && !out->ok);
  EXPECT_EQ(out->why_not, TokenizeResult::kFailed);

  out.reset();
  auto call = h.start(&out);
  EXPECT_EQ(outstanding(), 1u);
  call->cancel();  // the client went away
  call.reset();
  EXPECT_EQ(outstanding(), 0u);
  EXPECT_FALSE(out);

  h.start(&out);
  EXPECT_EQ(outstanding(), 1u);
  h.run_until([&] { return out.has_value(); }, test::scaled(5s));
  ASSERT_TRUE(out && !out->ok);
  EXPECT_EQ(out->why_not, TokenizeResult::kTimeout);
  EXPECT_EQ(outstanding(), 0u);
}

// tokenize_timeout_ms bounds the whole call: a node that sends its answer a byte at a time (each
// read well within any per-read timeout) is cut at the deadline, and the call is closed.
TEST(CacheTokenize, TheWholeCallHasADeadline) {
  auto tokenizer = node("127.0.0.6", Role::kDecode, Connector::kUnknown, kTokenizeLabel);
  TokenizeHarness h({tokenizer}, 100ms);
  std::optional<Outcome> out;
  const auto started = std::chrono::steady_clock::now();
  h.start(&out);
  std::shared_ptr<FakeCall> call = h.port.calls.back();
  call->cb.on_head(200, {});
  // One byte every 5 ms from a libuv timer of the same loop.
  struct Trickle {
    uv_timer_t timer;
    FakeCall* call;
    int bytes = 0;
  } trickle{{}, call.get()};
  uv_timer_init(h.loop(), &trickle.timer);
  trickle.timer.data = &trickle;
  uv_timer_start(&trickle.timer, [](uv_timer_t* t) {
    auto* tr = static_cast<Trickle*>(t->data);
    tr->call->body(" ");
    ++tr->bytes;
  }, 5, 5);
  h.run_until([&] { return out.has_value(); }, test::scaled(5s));
  const auto took = std::chrono::steady_clock::now() - started;
  uv_close(reinterpret_cast<uv_handle_t*>(&trickle.timer), nullptr);
  ASSERT_TRUE(out && !out->ok);
  EXPECT_EQ(out->why_not, TokenizeResult::kTimeout);
  EXPECT_GE(took, 95ms);
  EXPECT_LT(took, test::scaled(2s));
  EXPECT_GE(trickle.bytes, 3);  // the node kept sending: no per-read timeout would have fired
  EXPECT_TRUE(call->cancelled);
  EXPECT_EQ(h.shared.counters.buffered.held.load(), 0);
}

// The answer is held in memory until whole: its bytes count in limits.max_buffered_bytes with
// every request body and buffered answer, and are given back when the call ends; an answer that
// would take the budget over ends the call (memory_budget) instead.
TEST(CacheTokenize, TheAnswerTakesItsShareOfTheMemoryBudget) {
  auto tokenizer = node("127.0.0.6", Role::kDecode, Connector::kUnknown, kTokenizeLabel);
  TokenizeHarness h({tokenizer}, 10s, /*budget=*/1000);
  auto& buffered = h.shared.counters.buffered.held;
  std::optional<Outcome> out;
  h.start(&out);
  std::shared_ptr<FakeCall> call = h.port.calls.back();
  call->cb.on_head(200, {});
  call->body(R"({"tokens":[1,)");
  EXPECT_EQ(buffered.load(), 13);
  call->body(R"(2]})");
  EXPECT_EQ(buffered.load(), 16);
  call->answer(200, "");
  ASSERT_TRUE(out && out->ok);
  EXPECT_EQ(buffered.load(), 0);

  buffered.store(900);  // other requests hold most of the budget
  out.reset();
  h.start(&out);
  call = h.port.calls.back();
  call->cb.on_head(200, {});
  call->body(std::string(50, ' '));
  EXPECT_EQ(buffered.load(), 950);
  call->body(std::string(60, ' '));
  ASSERT_TRUE(out && !out->ok);
  EXPECT_EQ(out->why_not, TokenizeResult::kMemoryBudget);
  EXPECT_TRUE(call->cancelled);
  EXPECT_EQ(buffered.load(), 900);
  EXPECT_EQ(to_string(TokenizeResult::kMemoryBudget), "memory_budget");
}

}  // namespace
}  // namespace pdr::router::routing
