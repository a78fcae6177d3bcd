// RequestRoute (router/routing/request_route.h), the one door through which a request session
// asks where its request goes, against a fake upstream port on a libuv loop the test runs: a
// refusal when no pair exists, a cancel during the node /tokenize call that leaves nothing
// behind, a route whose load charges follow it, the decode-only re-route that avoids the
// decodes a request already tried, and a new attempt started from inside on_routed (a failed
// pre-step retried at once) that keeps its own route. Routes are built in the listener's storage:
// a refusal after pairing and a cancel during the pre-step leave it holding nothing, a route
// handed over stays there (a cancel from inside on_routed too) until the listener lets go. A
// request the prefills are too busy for goes to an idle decode alone, and its SLO check reads
// that decode's prediction. The
// session's use of it end to end: tests/router/proxy_session_test.cc and tests/integration
// (test_cache_tokenize, test_predicted_latency...).
#include "router/routing/request_route.h"

#include <gtest/gtest.h>
#include <uv.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "discovery/config/topology.h"
#include "discovery/instance.h"
#include "proto/base/snapshot_cell.h"
#include "router/cache/block_index.h"
#include "router/routing/cache_tokenize.h"
#include "router/proxy/proxy_shared.h"
#include "router/proxy/upstream_port.h"
#include "tests/support/router/fake_upstream_port.h"
#include "tests/support/router/test_instances.h"

namespace pdr::router::routing {
namespace {

using discovery::Instance;
using proto::Connector;
using proto::Role;
using proxy::ProxyShared;
using proxy::UpstreamPort;
using proxy::WorkerContext;

using test::FakeCall;
using test::FakePort;
using test::node;


// What a route() answered, once.
struct Answer {
  int calls = 0;
  Route* route = nullptr;  // the listener's storage, when routed
  std::optional<RouteRefusal> refusal;
};

// The route's listener, as the session is: owns the routes' storage, records the answers; `then`
// runs after one is recorded, inside on_routed. let_go() is the session's release_pair.
struct Listener final : RouteListener {
  void on_paired(const Pair&) override { ++paired; }
  void on_routed(Route* r, RouteRefusal* refused) override {
    ++answer.calls;
    EXPECT_TRUE(r == nullptr || r == &storage);
    answer.route = r;
    answer.refusal.reset();
    if (refused != nullptr) answer.refusal.emplace(std::move(*refused));
    if (then) then();
  }
  std::shared_ptr<void> keep_alive() override { return hold; }
  void let_go() {
    storage.prefill_load.release();
    storage.decode_load.release();
    storage.pair = Pair{};
  }

  Route storage;
  std::shared_ptr<void> hold = std::make_shared<int>(0);
  Answer answer;
  int paired = 0;
  std::function<void()> then;
};

// One worker on a loop of the test's own, and a request's body.
class Harness {
 public:
  explicit Harness(std::vector<std::shared_ptr<const Instance>> instances, bool tokenize = false,
                   const std::function<void(config::Topology&)>& configure = {}) {
    EXPECT_EQ(uv_loop_init(&loop_), 0);
    auto topology = std::make_shared<config::Topology>();
    if (tokenize) {
      topology->policies.prefill = config::PolicyName::kCacheAware;
      topology->policies.decode = config::PolicyName::kCacheAware;
      topology->policies.cache_aware.tokenize_by_node = true;
      shared.block_index = &index_;
    }
    if (configure) configure(*topology);
    topology_.publish(topology);
    topo = topology;
    auto snapshot = std::make_shared<discovery::RegistrySnapshot>();
    snapshot->instances = std::move(instances);
    registry_.publish(snapshot);
    shared.registry = &registry_;
    shared.topology = &topology_;
    worker = std::make_unique<WorkerContext>(shared, 0, &loop_, &port);
    EXPECT_TRUE(proto::JsonObjectBody::parse_owned(R"({"model":"m","prompt":"a text prompt"})", proto::JsonLimits{},
                                                   &body)
                    .is_ok());
    facts.body = &body;
    facts.model = "m";
    facts.path = "/v1/completions";
  }
  ~Harness() {
    worker.reset();
    uv_run(&loop_, UV_RUN_DEFAULT);  // the timer queue's handle closes
    EXPECT_EQ(uv_loop_close(&loop_), 0);
  }

  // A route for the request, begun, answering `listener`.
  std::unique_ptr<RequestRoute> begin(Listener& listener) {
    auto route = std::make_unique<RequestRoute>(*worker, shared, *topo, listener, listener.storage);
    EXPECT_FALSE(route->begin(facts).has_value());
    return route;
  }

  ProxyShared shared;
  FakePort port;
  std::unique_ptr<WorkerContext> worker;
  std::shared_ptr<const config::Topology> topo;
  proto::JsonObjectBody body;
  RequestFacts facts;

 private:
  uv_loop_t loop_{};
  cache::BlockIndex index_{1024};
  SnapshotCell<discovery::RegistrySnapshot> registry_;
  SnapshotCell<config::Topology> topology_;
};

// No prefill is up: the route is refused, once, with pairing's reason, and holds nothing.
TEST(RequestRoute, RefusedWhenNoPairExists) {
  Harness h({node("127.0.0.2", Role::kDecode)});
  Listener listener;
  auto route = h.begin(listener);
  const auto& keep_alive = listener.hold;
  const Answer& answer = listener.answer;
  route->route(false);
  EXPECT_EQ(answer.calls, 1);  // at once: nothing to wait for
  EXPECT_EQ(listener.paired, 0);
  ASSERT_TRUE(answer.refusal);
  EXPECT_FALSE(answer.route);
  EXPECT_EQ(answer.refusal->reason, RouteRefusalReason::kNoPair);
  EXPECT_EQ(answer.refusal->code, "no_pair");
  EXPECT_FALSE(answer.refusal->message.empty());
  EXPECT_EQ(keep_alive.use_count(), 1);
  EXPECT_TRUE(h.port.calls.empty());
}

// A pair: handed over in the listener's storage with its load charges (a request in flight on
// each node) and DP ranks; they stay there after on_routed returns, and the load goes back when
// the listener lets go of the pair.
TEST(RequestRoute, ARouteCarriesThePairsLoad) {
  auto prefill = node("127.0.0.1", Role::kPrefill);
  auto decode = node("127.0.0.2", Role::kDecode);
  Harness h({prefill, decode});
  Listener listener;
  auto route = h.begin(listener);
  const auto& keep_alive = listener.hold;
  Answer& answer = listener.answer;
  route->route(false);
  ASSERT_EQ(answer.calls, 1);
  EXPECT_EQ(listener.paired, 1);
  ASSERT_TRUE(answer.route);
  EXPECT_EQ(answer.route->pair.prefill->key, prefill->key);
  EXPECT_EQ(answer.route->pair.decode->key, decode->key);
  EXPECT_NE(answer.route->dialect, nullptr);
  EXPECT_TRUE(answer.route->pre_step.is_ok());
  EXPECT_FALSE(answer.route->decode_alone);
  EXPECT_EQ(prefill->liveness->outstanding.load(), 1u);
  EXPECT_EQ(decode->liveness->outstanding.load(), 1u);
  EXPECT_EQ(keep_alive.use_count(), 1);  // answered at once: no step held the request
  EXPECT_EQ(listener.storage.pair.prefill, prefill);
  listener.let_go();
  EXPECT_EQ(prefill->liveness->outstanding.load(), 0u);
  EXPECT_EQ(decode->liveness->outstanding.load(), 0u);
}

// The route waits in the SLO gate, unanswered; then it is cancelled and the gate emptied.
void expect_parked(Harness& h, RequestRoute& route, const Listener& listener) {
  EXPECT_EQ(listener.answer.calls, 0);
  EXPECT_EQ(h.shared.slo_gate.parked(), 1u);
  route.cancel();
  h.shared.slo_gate.drop_all();
}

// predicted_latency on both legs and conditional_disaggregation.prefill_busy_ms: a request whose
// TTFT SLO no prefill can meet (their queues) but an idle decode can goes to that decode alone at
// once instead of waiting for a prefill: the SLO check reads the prediction of what will run.
// Without prefill_busy_ms the same request waits (parks in the SLO gate), sending nothing.
TEST(RequestRoute, TheSloCheckReadsTheDecodeAlonePrediction) {
  for (const bool busy_alone : {true, false}) {
    SCOPED_TRACE(busy_alone ? "prefill_busy_ms" : "off");
    auto prefill = node("127.0.0.1", Role::kPrefill);
    auto decode = node("127.0.0.2", Role::kDecode);
    auto other_decode = node("127.0.0.3", Role::kDecode);
    Harness h({prefill, decode, other_decode}, false, [&](config::Topology& t) {
      t.policies.prefill = config::PolicyName::kPredictedLatency;
      t.policies.decode = config::PolicyName::kPredictedLatency;
      t.conditional_disaggregation.enabled = true;
      t.conditional_disaggregation.prefill_busy_ms = busy_alone ? 1000 : 0;
    });
    // 16,000 tokens queued on the prefill: 2 s at the default 8,000 tokens/s.
    discovery::LoadCharge queued(*prefill, std::nullopt);
    queued.queue_prefill(16000);
    h.facts.slo.ttft_ms = 1000;
    Listener listener;
    auto route = h.begin(listener);
    route->route(false);
    if (!busy_alone) {
      expect_parked(h, *route, listener);  // waiting for a prefill within the SLO
      continue;
    }
    ASSERT_EQ(listener.answer.calls, 1);
    ASSERT_TRUE(listener.answer.route);
    EXPECT_EQ(listener.answer.route->decode_alone, DecodeAloneReason::kPrefillBusy);
    EXPECT_EQ(h.shared.slo_gate.parked(), 0u);
    listener.let_go();
  }
}

// A TPOT SLO no decode is predicted to meet holds a request (it parks in the SLO gate), unless
// its prompt alone overflows a decode's KV: then no node ever could, and it is sent on at once
// (the node answers, e.g. 400 for a prompt over its context).
TEST(RequestRoute, TheTpotCheckDoesNotHoldAPromptNoDecodeCouldEverTake) {
  for (const bool overflows : {true, false}) {
    SCOPED_TRACE(overflows ? "over kv_capacity_tokens" : "within");
    auto prefill = node("127.0.0.1", Role::kPrefill);
    auto decode = node("127.0.0.2", Role::kDecode);
    Harness h({prefill, decode}, false, [&](config::Topology& t) {
      t.policies.prefill = config::PolicyName::kPredictedLatency;
      t.policies.decode = config::PolicyName::kPredictedLatency;
      t.policies.predicted_latency.kv_capacity_tokens = overflows ? 1 : 1000000;
    });
    h.facts.slo.tpot_ms = 1;  // under the default 7.5 ms decode step: never predicted met
    Listener listener;
    auto route = h.begin(listener);
    route->route(false);
    if (!overflows) {
      expect_parked(h, *route, listener);
      continue;
    }
    ASSERT_EQ(listener.answer.calls, 1);
    EXPECT_TRUE(listener.answer.route);
    EXPECT_EQ(h.shared.slo_gate.parked(), 0u);
    listener.let_go();
  }
}

// The client goes away while the node /tokenize call runs: the call is cancelled and counted,
// the answer never comes, and neither the request (keep_alive) nor the node's load is held.
TEST(RequestRoute, ACancelDuringTheTokenizeCallLeavesNothingBehind) {
  auto prefill = node("127.0.0.1", Role::kPrefill);
  auto decode = node("127.0.0.2", Role::kDecode);
  Harness h({prefill, decode}, /*tokenize=*/true);
  Listener listener;
  auto route = h.begin(listener);
  const auto& keep_alive = listener.hold;
  const Answer& answer = listener.answer;
  route->route(false);
  ASSERT_EQ(h.port.calls.size(), 1u);
  EXPECT_EQ(h.port.calls[0]->request.path, "/tokenize");
  EXPECT_EQ(answer.calls, 0);  // waiting for the node
  EXPECT_GT(keep_alive.use_count(), 1);
  EXPECT_EQ(prefill->liveness->outstanding.load(), 1u);  // the call counts on its node

  route->cancel();
  EXPECT_TRUE(h.port.calls[0]->cancelled);
  EXPECT_EQ(keep_alive.use_count(), 1);
  EXPECT_EQ(prefill->liveness->outstanding.load(), 0u);
  EXPECT_EQ(decode->liveness->outstanding.load(), 0u);
  EXPECT_EQ(h.shared.counters.cache_tokenize[static_cast<size_t>(TokenizeResult::kCancelled)].load(), 1u);
  EXPECT_EQ(answer.calls, 0);
  route->cancel();  // idempotent: counted once
  EXPECT_EQ(h.shared.counters.cache_tokenize[static_cast<size_t>(TokenizeResult::kCancelled)].load(), 1u);
}

// The same call answered: the route follows, once, and the tokenize call holds nothing after.
TEST(RequestRoute, TheTokenizeAnswerLeadsToTheRoute) {
  auto prefill = node("127.0.0.1", Role::kPrefill);
  auto decode = node("127.0.0.2", Role::kDecode);
  Harness h({prefill, decode}, /*tokenize=*/true);
  Listener listener;
  auto route = h.begin(listener);
  const auto& keep_alive = listener.hold;
  const Answer& answer = listener.answer;
  route->route(false);
  ASSERT_EQ(h.port.calls.size(), 1u);
  EXPECT_GT(keep_alive.use_count(), 1);  // the call holds the request
  const http::UpstreamCallbacks cb = h.port.calls[0]->cb;
  h.port.calls[0]->cb = {};
  cb.on_head(200, {});
  cb.on_body(R"({"count":3,"max_model_len":8,"tokens":[1,2,3]})");
  cb.on_complete();
  ASSERT_EQ(answer.calls, 1);
  ASSERT_TRUE(answer.route);
  EXPECT_EQ(route->prompt().count, 3u);
  EXPECT_EQ(route->prompt().source, PromptTokens::Source::kTokenized);
  EXPECT_EQ(h.shared.counters.cache_tokenize[static_cast<size_t>(TokenizeResult::kNoMatch)].load(), 1u);
  EXPECT_EQ(keep_alive.use_count(), 1);
}

// The decode retry that keeps the prefill: another decode, never one the request tried; none
// left is kNotFound.
TEST(RequestRoute, TheDecodeOnlyRerouteExcludesTheTriedDecodes) {
  auto prefill = node("127.0.0.1", Role::kPrefill);
  auto d1 = node("127.0.0.2", Role::kDecode);
  auto d2 = node("127.0.0.3", Role::kDecode);
  Harness h({prefill, d1, d2});
  Listener listener;
  auto route = h.begin(listener);
  const Answer& answer = listener.answer;
  route->route(false);
  ASSERT_TRUE(answer.route);
  const std::string first = answer.route->pair.decode->key;
  route->exclude(Role::kDecode, first);
  for (int i = 0; i < 10; ++i) {
    InstancePtr next;
    ASSERT_TRUE(route->reroute_decode(*prefill, &next).is_ok());
    EXPECT_NE(next->key, first) << i;
  }
  route->exclude(Role::kDecode, first == d1->key ? d2->key : d1->key);
  InstancePtr none;
  EXPECT_EQ(route->reroute_decode(*prefill, &none).code(), StatusCode::kNotFound);
  EXPECT_FALSE(none);
}

// The session retries a failed pre-step from inside on_routed, as a failed prefill leg is: the
// new attempt starts (and here waits for its own pre-step) before the first answer's on_routed
// returns. That attempt's route stays pending, charging its pair, and is answered when its
// pre-step is; the first route's pair is released.
TEST(RequestRoute, AnAttemptStartedInsideOnRoutedKeepsItsRoute) {
  auto p1 = node("127.0.0.1", Role::kPrefill, Connector::kMooncake);
  auto p2 = node("127.0.0.2", Role::kPrefill, Connector::kMooncake);
  auto decode = node("127.0.0.3", Role::kDecode, Connector::kMooncake);
  Harness h({p1, p2, decode});
  Listener listener;
  auto route = h.begin(listener);
  Answer& answer = listener.answer;
  route->route(false);
  ASSERT_EQ(h.port.calls.size(), 1u);  // the first prefill's bootstrap /query
  EXPECT_EQ(h.port.calls[0]->request.path, "/query");
  EXPECT_EQ(answer.calls, 0);
  EXPECT_GT(listener.hold.use_count(), 1);  // the pre-step holds the request
  const std::string first = h.port.calls[0]->target.host == "127.0.0.1" ? p1->key : p2->key;
  const auto& second = first == p1->key ? p2 : p1;

  listener.then = [&] {
    if (answer.calls != 1) return;  // the second answer is only recorded
    ASSERT_TRUE(answer.route);
    EXPECT_FALSE(answer.route->pre_step.is_ok());
    // What the session does for a failed pre-step: forget it, avoid the prefill, let go of the
    // pair, pair again (into the same storage).
    route->prefill_failed(*answer.route->dialect, *answer.route->pair.prefill);
    route->exclude(Role::kPrefill, answer.route->pair.prefill->key);
    listener.let_go();
    route->route(true);
  };
  h.port.calls[0]->answer(500, "down");
  EXPECT_EQ(answer.calls, 1);
  ASSERT_EQ(h.port.calls.size(), 2u);  // the second attempt's /query, on the other prefill
  EXPECT_EQ(h.port.calls[1]->request.path, "/query");
  EXPECT_EQ(h.port.calls[1]->target.host, second->http_address.host);
  // The second attempt's pair is charged while its pre-step runs (the first answer's return
  // did not drop it: it is in the storage), the first pair's prefill no longer.
  EXPECT_EQ(listener.storage.pair.prefill, second);
  EXPECT_EQ(second->liveness->outstanding.load(), 1u);
  EXPECT_EQ(decode->liveness->outstanding.load(), 1u);
  EXPECT_EQ((first == p1->key ? p1 : p2)->liveness->outstanding.load(), 0u);

  h.port.calls[1]->answer(200, R"({"0":{"engine_id":"engine-0","worker_addr":"127.0.0.1:17000"}})");
  ASSERT_EQ(answer.calls, 2);
  ASSERT_TRUE(answer.route);
  EXPECT_TRUE(answer.route->pre_step.is_ok()) << answer.route->pre_step.message();
  EXPECT_EQ(answer.route->pair.prefill->key, second->key);
  EXPECT_EQ(answer.route->prefill_facts.engine_id, "engine-0");
  EXPECT_EQ(listener.hold.use_count(), 1);
  listener.let_go();
  EXPECT_EQ(second->liveness->outstanding.load(), 0u);
  EXPECT_EQ(decode->liveness->outstanding.load(), 0u);
}

// Refused after pairing (n = 2 on a pair whose decode cannot serve alone): the pair's load goes
// back at once and the storage holds no pair, before the refusal is answered.
TEST(RequestRoute, ARefusalAfterPairingLeavesTheStorageEmpty) {
  auto prefill = node("127.0.0.1", Role::kPrefill, Connector::kMooncake);
  auto decode = node("127.0.0.2", Role::kDecode, Connector::kMooncake);
  Harness h({prefill, decode});
  h.facts.choices = 2;
  Listener listener;
  auto route = h.begin(listener);
  const Answer& answer = listener.answer;
  listener.then = [&] {
    EXPECT_FALSE(listener.storage.pair.prefill);
    EXPECT_FALSE(listener.storage.prefill_load.bound());
    EXPECT_FALSE(listener.storage.decode_load.bound());
    EXPECT_EQ(prefill->liveness->outstanding.load(), 0u);
    EXPECT_EQ(decode->liveness->outstanding.load(), 0u);
  };
  route->route(false);
  ASSERT_EQ(answer.calls, 1);
  EXPECT_EQ(listener.paired, 1);
  ASSERT_TRUE(answer.refusal);
  EXPECT_EQ(answer.refusal->reason, RouteRefusalReason::kBadParameter);
  EXPECT_EQ(answer.route, nullptr);
  EXPECT_TRUE(h.port.calls.empty());  // no pre-step for a refused pair
  EXPECT_EQ(listener.hold.use_count(), 1);
}

// Cancelled while its pre-step runs: the route, not handed over, gives its pair back from the
// storage at once; the pre-step's late answer is ignored and leaves the storage alone.
TEST(RequestRoute, ACancelDuringThePreStepEmptiesTheStorage) {
  auto prefill = node("127.0.0.1", Role::kPrefill, Connector::kMooncake);
  auto decode = node("127.0.0.2", Role::kDecode, Connector::kMooncake);
  Harness h({prefill, decode});
  Listener listener;
  auto route = h.begin(listener);
  const Answer& answer = listener.answer;
  route->route(false);
  ASSERT_EQ(h.port.calls.size(), 1u);
  EXPECT_EQ(h.port.calls[0]->request.path, "/query");
  EXPECT_EQ(listener.storage.pair.prefill, prefill);  // built in place from its pairing on
  EXPECT_EQ(prefill->liveness->outstanding.load(), 1u);
  EXPECT_EQ(decode->liveness->outstanding.load(), 1u);

  route->cancel();
  EXPECT_FALSE(listener.storage.pair.prefill);
  EXPECT_FALSE(listener.storage.pair.decode);
  EXPECT_EQ(prefill->liveness->outstanding.load(), 0u);
  EXPECT_EQ(decode->liveness->outstanding.load(), 0u);
  h.port.calls[0]->answer(200, R"({"0":{"engine_id":"engine-0","worker_addr":"127.0.0.1:17000"}})");
  EXPECT_EQ(answer.calls, 0);
  EXPECT_TRUE(listener.storage.prefill_facts.engine_id.empty());
  EXPECT_EQ(listener.hold.use_count(), 1);
}

// The request ends inside on_routed (the session's end() cancels its route): the route handed
// over is the listener's, so the cancel leaves it in the storage, charged, until it lets go.
TEST(RequestRoute, ACancelInsideOnRoutedLeavesTheHandedOverRoute) {
  auto prefill = node("127.0.0.1", Role::kPrefill);
  auto decode = node("127.0.0.2", Role::kDecode);
  Harness h({prefill, decode});
  Listener listener;
  auto route = h.begin(listener);
  const Answer& answer = listener.answer;
  listener.then = [&] { route->cancel(); };
  route->route(false);
  ASSERT_EQ(answer.calls, 1);
  ASSERT_EQ(answer.route, &listener.storage);
  EXPECT_EQ(listener.storage.pair.prefill, prefill);
  EXPECT_EQ(prefill->liveness->outstanding.load(), 1u);
  EXPECT_EQ(decode->liveness->outstanding.load(), 1u);
  listener.let_go();
  EXPECT_EQ(prefill->liveness->outstanding.load(), 0u);
  EXPECT_EQ(decode->liveness->outstanding.load(), 0u);
}

}  // namespace
}  // namespace pdr::router::routing
