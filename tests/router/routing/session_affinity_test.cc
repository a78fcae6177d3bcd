// Session affinity's pure parts: the binding table (bounds, LRU, idle expiry, exact match,
// bindings per client), the spill rule, reading the session id (source order, checks) and
// steering pairing to the bound nodes.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "discovery/config/topology.h"
#include "discovery/load_charge.h"
#include "proto/json_splice.h"
#include "router/policies/predicted_latency.h"
#include "router/policies/prompt_tokens.h"
#include "router/policies/session_spill.h"
#include "router/routing/ejection.h"
#include "router/routing/pairing.h"
#include "router/routing/session_affinity.h"
#include "router/routing/session_table.h"

namespace pdr::router::routing {
namespace {

using namespace std::chrono_literals;
using discovery::Instance;
using discovery::InstanceState;
using discovery::RegistrySnapshot;
using proto::Connector;
using proto::Role;
using Clock = SessionTable::Clock;

SessionTable::Limits limits(size_t max_sessions = 1000, std::chrono::milliseconds ttl = 60s) {
  return SessionTable::Limits{max_sessions, ttl};
}

// ---- the table --------------------------------------------------------------------------------

TEST(SessionTable, MatchesIdsExactlyAndPerBinding) {
  SessionTable t;
  const auto t0 = Clock::now();
  t.bind({"", "abc"}, "127.0.40.1:1", "127.0.40.2:1", t0, limits());
  auto got = t.find({"", "abc"}, t0, limits());
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->prefill_key, "127.0.40.1:1");
  EXPECT_EQ(got->decode_key, "127.0.40.2:1");
  for (std::string_view other : {"ab", "abcd", "ABC", "abc ", ""}) {
    EXPECT_FALSE(t.find({"", other}, t0, limits()).has_value()) << other;
  }
  // Another client's binding does not see the session, nor does a binding whose bytes run into
  // the id ("a" + "bc" against "" + "abc").
  EXPECT_FALSE(t.find({"other-client", "abc"}, t0, limits()).has_value());
  t.bind({"a", "bc"}, "127.0.40.3:1", "127.0.40.4:1", t0, limits());
  EXPECT_EQ(t.find({"", "abc"}, t0, limits())->decode_key, "127.0.40.2:1");
  EXPECT_EQ(t.find({"a", "bc"}, t0, limits())->decode_key, "127.0.40.4:1");
  // Rebinding replaces.
  t.bind({"", "abc"}, "127.0.40.5:1", "127.0.40.6:1", t0, limits());
  EXPECT_EQ(t.find({"", "abc"}, t0, limits())->prefill_key, "127.0.40.5:1");
  EXPECT_EQ(t.stats().entries, 2u);
}

TEST(SessionTable, ForgetsAfterIdleTtlButNotWhileUsed) {
  SessionTable t;
  const auto t0 = Clock::now();
  t.bind({"", "s1"}, "127.0.40.1:1", "127.0.40.2:1", t0, limits(1000, 10s));
  // Used every 6 s: never idle for 10 s.
  for (int i = 1; i <= 5; ++i) EXPECT_TRUE(t.find({"", "s1"}, t0 + i * 6s, limits(1000, 10s)).has_value()) << i;
  EXPECT_FALSE(t.find({"", "s1"}, t0 + 30s + 11s, limits(1000, 10s)).has_value());
  EXPECT_EQ(t.stats().entries, 0u);
  EXPECT_EQ(t.stats().expired, 1u);
}

TEST(SessionTable, StaysWithinMaxSessionsAndEvictsTheLeastRecentlyUsed) {
  SessionTable t;
  const auto t0 = Clock::now();
  constexpr size_t kMax = 160;
  t.bind({"", "kept"}, "127.0.40.1:1", "127.0.40.2:1", t0, limits(kMax));
  for (int i = 0; i < 20000; ++i) {
    t.bind({"", "s" + std::to_string(i)}, "127.0.40.3:1", "127.0.40.4:1", t0, limits(kMax));
    ASSERT_TRUE(t.find({"", "kept"}, t0, limits(kMax)).has_value()) << i;  // used: never the oldest
    ASSERT_LE(t.stats().entries, kMax);
  }
  EXPECT_FALSE(t.find({"", "s0"}, t0, limits(kMax)).has_value());
  EXPECT_TRUE(t.find({"", "s19999"}, t0, limits(kMax)).has_value());
  const auto s = t.stats();
  EXPECT_EQ(s.evicted + s.entries, 20001u);
  EXPECT_GE(s.entries, kMax / 2);  // shards share the limit; none is starved
}

TEST(SessionTable, ThreadsBindAndFindConcurrently) {
  SessionTable t;
  std::vector<std::thread> threads;
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&t, w] {
      for (int i = 0; i < 2000; ++i) {
        const std::string id = "s" + std::to_string((i * 7 + w) % 300);
        const auto now = Clock::now();
        if (!t.find({"", id}, now, limits(200)).has_value()) {
          t.bind({"", id}, "127.0.40.1:1", "127.0.40.2:1", now, limits(200));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(t.stats().entries, 200u + SessionTable::kShards);
}

// ---- the spill rule ---------------------------------------------------------------------------

TEST(SessionSpill, SpillsOnlyBeyondTheMargin) {
  const SpillMargins m{4, 2.0};
  const SessionNodeLoad idle{0, 1};
  const std::vector<SessionNodeLoad> alternatives{{3, 1}, {1, 1}};
  EXPECT_FALSE(sticky_overloaded({5, 1}, alternatives, m));  // 4 more than the best: within
  EXPECT_TRUE(sticky_overloaded({6, 1}, alternatives, m));   // 5 more: beyond
  EXPECT_FALSE(sticky_overloaded({100, 1}, {}, m));          // nowhere to go
  EXPECT_FALSE(sticky_overloaded({10, 2}, std::vector<SessionNodeLoad>{{1, 1}}, m));  // 5 per weight, 4 more
  EXPECT_TRUE(sticky_overloaded({12, 2}, std::vector<SessionNodeLoad>{{1, 1}}, m));
  EXPECT_FALSE(sticky_overloaded({0, 0}, std::vector<SessionNodeLoad>{idle}, m));  // weight 0 taken as 1
  // Seconds of queue, only between measured nodes.
  EXPECT_TRUE(sticky_overloaded({1, 1, 3.5}, std::vector<SessionNodeLoad>{{1, 1, 1.0}}, m));
  EXPECT_FALSE(sticky_overloaded({1, 1, 3.0}, std::vector<SessionNodeLoad>{{1, 1, 1.0}}, m));
  EXPECT_FALSE(sticky_overloaded({1, 1, 30.0}, std::vector<SessionNodeLoad>{{1, 1, -1}}, m));
  EXPECT_FALSE(sticky_overloaded({1, 1, -1}, std::vector<SessionNodeLoad>{{1, 1, 0}}, m));
  // Where both queues are known they decide alone: a prefill's requests include those whose
  // decodes still run.
  EXPECT_FALSE(sticky_overloaded({10, 1, 0.5}, std::vector<SessionNodeLoad>{{0, 1, 0.4}}, m));
  EXPECT_TRUE(sticky_overloaded({10, 1, 30.0}, std::vector<SessionNodeLoad>{{0, 1, -1}, {12, 1, 1.0}}, m));
  // Margin 0: any imbalance spills.
  EXPECT_TRUE(sticky_overloaded({1, 1}, std::vector<SessionNodeLoad>{idle}, SpillMargins{0, 0}));
  EXPECT_FALSE(sticky_overloaded({1, 1}, std::vector<SessionNodeLoad>{{1, 1}}, SpillMargins{0, 0}));
}

// ---- the session id ---------------------------------------------------------------------------

config::Topology topology() {
  config::Topology t;
  t.session_affinity.enabled = true;
  t.session_affinity.headers = {"x-session-affinity", "session-id"};
  t.session_affinity.fields = {"conversation_id", "user"};
  t.session_affinity.max_id_bytes = 16;
  t.multi_turn.bind_to = config::Topology::MultiTurn::BindTo::kAuthorization;
  return t;
}

proto::JsonObjectBody body(std::string_view text) {
  proto::JsonObjectBody b;
  EXPECT_TRUE(proto::JsonObjectBody::parse(text, {}, &b).is_ok()) << text;
  return b;
}

std::optional<SessionAffinityRequest> begin(std::string_view json, std::optional<std::string_view> header,
                                            SessionTable& table, SessionAffinityCounters& counters,
                                            const config::Topology& t = topology(),
                                            std::string_view authorization = "Bearer a") {
  const auto b = body(json);
  return SessionAffinityRequest::begin(b, t, header, authorization, "", table, counters);
}

TEST(SessionAffinityRequest, TakesTheFirstPresentSourceInOrder) {
  SessionTable table;
  SessionAffinityCounters c;
  auto r = begin(R"({"conversation_id":"conv","user":"u"})", "hdr", table, c);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->id(), "hdr");
  r = begin(R"({"conversation_id":"conv","user":"u"})", std::nullopt, table, c);
  EXPECT_EQ(r->id(), "conv");
  r = begin(R"({"conversation_id":null,"user":"u"})", std::nullopt, table, c);
  EXPECT_EQ(r->id(), "u");
  EXPECT_FALSE(begin(R"({"prompt":"x"})", std::nullopt, table, c).has_value());
  auto off = topology();
  off.session_affinity.enabled = false;
  EXPECT_FALSE(begin(R"({"user":"u"})", "hdr", table, c, off).has_value());
  EXPECT_EQ(c.bad_ids.load(), 0u);
}

TEST(SessionAffinityRequest, IgnoresAndCountsBadIds) {
  SessionTable table;
  SessionAffinityCounters c;
  for (const auto& [json, header] : std::vector<std::pair<std::string, std::optional<std::string>>>{
           {R"({})", std::string(17, 'a')},             // longer than max_id_bytes
           {R"({})", std::string("two words")},         // a space
           {R"({})", std::string("")},                  // empty
           {R"({})", std::string("tab\there")},         // a control character
           {R"({"conversation_id":"caf\u00e9"})", std::nullopt},  // an escape: a second spelling
           {R"({"conversation_id":12})", std::nullopt},  // not a string
           {R"({"conversation_id":{"a":1}})", std::nullopt}}) {
    const std::optional<std::string_view> h = header ? std::optional<std::string_view>(*header) : std::nullopt;
    EXPECT_FALSE(begin(json, h, table, c).has_value()) << json;
  }
  EXPECT_EQ(c.bad_ids.load(), 7u);
  EXPECT_EQ(table.stats().entries, 0u);
}

// ---- steering ---------------------------------------------------------------------------------

void eject(const std::shared_ptr<Instance>& node, discovery::Clock::time_point now) {
  const EjectionRule rule{3, std::chrono::milliseconds(5000)};
  for (uint32_t i = 0; i < rule.after; ++i) note_connect_failure(*node->liveness, now, rule);
}

std::shared_ptr<Instance> node(std::string key, Role role) {
  auto i = std::make_shared<Instance>();
  i->key = key;
  i->role = role;
  i->connector = Connector::kNixl;
  i->state = InstanceState::kUp;
  const auto colon = key.rfind(':');
  i->http_address = proto::HostPort{key.substr(0, colon), static_cast<uint16_t>(std::stoi(key.substr(colon + 1)))};
  return i;
}

struct Cluster {
  std::shared_ptr<Instance> p1 = node("127.0.41.1:1", Role::kPrefill), p2 = node("127.0.41.2:1", Role::kPrefill);
  std::shared_ptr<Instance> d1 = node("127.0.41.3:1", Role::kDecode), d2 = node("127.0.41.4:1", Role::kDecode);
  RegistrySnapshot snapshot() const {
    RegistrySnapshot s;
    s.instances = {p1, p2, d1, d2};
    return s;
  }
};

// Routes one turn of session "s" of client "Bearer a": the pair's keys.
std::pair<std::string, std::string> turn(const RegistrySnapshot& s, const config::Topology& t, SessionTable& table,
                                         SessionAffinityCounters& c) {
  static auto prefill_policy = make_round_robin_policy();
  static auto decode_policy = make_round_robin_policy();
  auto r = begin(R"({})", "s", table, c, t);
  EXPECT_TRUE(r.has_value());
  PairQuery q{{}, {}, {}, {}, discovery::Clock::now()};
  r->steer(s, t, &q);
  Pair pair;
  EXPECT_TRUE(choose_pair(s, q, *prefill_policy, *decode_policy, &pair).is_ok());
  r->routed(pair, t, table, c);
  return {pair.prefill->key, pair.decode->key};
}

TEST(SessionAffinitySteer, KeepsASessionOnItsNodesWhileTheyAreUsable) {
  Cluster cl;
  const auto s = cl.snapshot();
  auto t = topology();
  SessionTable table;
  SessionAffinityCounters c;
  const auto first = turn(s, t, table, c);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(turn(s, t, table, c), first) << i;  // round robin would move it
  EXPECT_EQ(c.misses.load(), 1u);
  EXPECT_EQ(c.hits.load(), 6u);
  EXPECT_EQ(c.rebinds.load(), 0u);
  // The bound decode drains: the session moves and the new binding sticks.
  auto& bound_decode = first.second == cl.d1->key ? cl.d1 : cl.d2;
  bound_decode->state = InstanceState::kDraining;
  const auto moved = turn(cl.snapshot(), t, table, c);
  EXPECT_NE(moved.second, first.second);
  EXPECT_EQ(moved.first, first.first);  // the prefill stays
  EXPECT_EQ(c.broken.load(), 1u);
  EXPECT_EQ(c.rebinds.load(), 1u);
  bound_decode->state = InstanceState::kUp;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(turn(cl.snapshot(), t, table, c), moved) << i;
  // An ejected prefill breaks the binding too.
  auto& bound_prefill = moved.first == cl.p1->key ? cl.p1 : cl.p2;
  eject(bound_prefill, discovery::Clock::now());
  EXPECT_NE(turn(cl.snapshot(), t, table, c).first, moved.first);
}

TEST(SessionAffinitySteer, SpillsFromAnOverloadedNodeAndRebinds) {
  Cluster cl;
  const auto s = cl.snapshot();
  auto t = topology();
  t.session_affinity.spill_margin_requests = 2;
  SessionTable table;
  SessionAffinityCounters c;
  const auto first = turn(s, t, table, c);
  auto& bound_decode = first.second == cl.d1->key ? cl.d1 : cl.d2;
  bound_decode->liveness->outstanding = 2;  // 2 beyond the idle other: within the margin
  EXPECT_EQ(turn(s, t, table, c), first);
  bound_decode->liveness->outstanding = 3;  // 3 beyond: spill
  const auto spilled = turn(s, t, table, c);
  EXPECT_NE(spilled.second, first.second);
  EXPECT_EQ(c.spills.load(), 1u);
  EXPECT_EQ(c.rebinds.load(), 1u);
  // The new binding sticks, even once the old node is idle again.
  bound_decode->liveness->outstanding = 0;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(turn(s, t, table, c).second, spilled.second) << i;
}

// Under predicted_latency the bound prefill is judged by its predicted TTFT (which credits the
// prompt it holds) against the fastest candidate's, with spill_margin_queue_ms as the margin.
struct PredictedTurns {
  config::Topology t = [] {
    config::Topology t = topology();
    t.policies.prefill = config::PolicyName::kPredictedLatency;
    t.policies.predicted_latency.default_prefill_tokens_per_second = 1000;
    t.policies.predicted_latency.kv_transfer_ns_per_token = 0;
    t.session_affinity.spill_margin_queue = 2000ms;
    return t;
  }();
  std::unique_ptr<Policy> prefill_policy = make_predicted_latency_policy(t.policies.predicted_latency, PolicyLeg::kPrefill);
  std::unique_ptr<Policy> decode_policy = make_round_robin_policy();
  PromptTokens prompt{1000, 0, PromptTokens::Source::kTokenIds};
  CacheHits hits;  // set by a test: what each prefill holds of the 1,000-token prompt
  SessionTable table;
  SessionAffinityCounters c;

  // One turn of session "s": the pair's keys, and what the explanation says of the prefill.
  std::pair<std::string, std::string> turn(const RegistrySnapshot& s, LegExplanation* prefill = nullptr) {
    auto r = begin(R"({})", "s", table, c, t);
    EXPECT_TRUE(r.has_value());
    RouteExplanation explanation;
    PairQuery q{{}, {}, {}, {}, discovery::Clock::now()};
    q.summary.prompt = &prompt;
    if (!hits.nodes.empty()) q.summary.cache = &hits;
    q.summary.explain = &explanation;
    r->steer(s, t, &q);
    Pair pair;
    EXPECT_TRUE(choose_pair(s, q, *prefill_policy, *decode_policy, &pair).is_ok());
    r->routed(pair, t, table, c);
    if (prefill != nullptr) *prefill = explanation.prefill;
    return {pair.prefill->key, pair.decode->key};
  }
};

TEST(SessionAffinitySteer, UnderPredictedLatencyAPrefillSpillsOnlyPastTheMarginOfPredictedTtft) {
  Cluster cl;
  const auto s = cl.snapshot();
  PredictedTurns pt;
  const auto first = pt.turn(s);
  auto& bound = first.first == cl.p1->key ? cl.p1 : cl.p2;
  auto& other = first.first == cl.p1->key ? cl.p2 : cl.p1;
  // Both cold, 1,000 tokens/s: the bound prefill with 1,500 tokens queued is predicted 2.5 s
  // against the idle one's 1 s: within the 2 s margin, although the policy alone would move it.
  discovery::LoadCharge queued(*bound, std::nullopt, false);
  queued.queue_prefill(1500);
  LegExplanation e;
  EXPECT_EQ(pt.turn(s, &e), first);
  EXPECT_TRUE(e.preferred);
  EXPECT_EQ(e.rows[e.chosen].key, bound->key);
  EXPECT_EQ(pt.c.hits.load(), 1u);
  // 2,500 queued: 3.5 s against 1 s, past the margin: the turn goes to the policy's pick.
  queued.queue_prefill(1000);
  const auto spilled = pt.turn(s, &e);
  EXPECT_EQ(spilled.first, other->key);
  EXPECT_EQ(spilled.second, first.second);  // the decode is judged on its own
  EXPECT_FALSE(e.preferred);
  EXPECT_EQ(e.rows[e.chosen].key, other->key);
  EXPECT_EQ(pt.c.spills.load(), 1u);
  EXPECT_EQ(pt.c.rebinds.load(), 1u);
  // The new binding sticks once the old prefill is idle again.
  queued.release();
  EXPECT_EQ(pt.turn(s).first, other->key);
  EXPECT_EQ(pt.c.hits.load(), 2u);
}

TEST(SessionAffinitySteer, UnderPredictedLatencyThePromptABoundPrefillHoldsKeepsItThroughItsQueue) {
  Cluster cl;
  const auto s = cl.snapshot();
  PredictedTurns pt;
  const auto first = pt.turn(s);
  auto& bound = first.first == cl.p1->key ? cl.p1 : cl.p2;
  // It holds 900 of the 1,000 tokens: with 2,500 queued it is predicted 2.6 s against the cold
  // idle prefill's 1 s, within the margin; the ledger rule (2.5 s of queue against none, past the
  // same 2 s margin) would have spilled it and recomputed the session's prompt elsewhere.
  pt.hits.source = CacheHits::Source::kKvEvents;
  pt.hits.prompt_units = 1000;
  pt.hits.nodes = {{bound->key, 900}};
  for (const auto& p : {cl.p1, cl.p2}) {  // both measured at 1,000 tokens/s: the ledger rule applies
    for (int i = 0; i < 3; ++i) p->liveness->ledger.prefill_tokens_per_second.add(1000, std::chrono::steady_clock::now());
  }
  discovery::LoadCharge queued(*bound, std::nullopt, false);
  queued.queue_prefill(2500);
  EXPECT_EQ(pt.turn(s), first);
  EXPECT_EQ(pt.c.spills.load(), 0u);
  EXPECT_EQ(pt.c.hits.load(), 1u);
  // Under another policy the ledger rule judges it, and spills (the policy then picks freely).
  pt.t.policies.prefill = config::PolicyName::kRoundRobin;
  pt.prefill_policy = make_round_robin_policy();
  pt.turn(s);
  EXPECT_EQ(pt.c.spills.load(), 1u);
}

TEST(SessionAffinitySteer, AnotherClientNamingTheSameIdGetsItsOwnBinding) {
  Cluster cl;
  const auto s = cl.snapshot();
  auto t = topology();
  SessionTable table;
  SessionAffinityCounters c;
  turn(s, t, table, c);
  const auto b = body("{}");
  auto other = SessionAffinityRequest::begin(b, t, std::string_view("s"), "Bearer b", "", table, c);
  ASSERT_TRUE(other.has_value());
  EXPECT_FALSE(other->bound().has_value());
}

TEST(Pairing, APreferredPrefillIsUsedWhenAmongTheCandidates) {
  Cluster cl;
  const auto s = cl.snapshot();
  auto rr = make_round_robin_policy();
  for (int i = 0; i < 4; ++i) {
    PairQuery q{{}, {}, {}, {}, discovery::Clock::now()};
    q.preferred_prefill = "127.0.41.2:1";
    Pair pair;
    ASSERT_TRUE(choose_pair(s, q, *rr, *rr, &pair).is_ok());
    EXPECT_EQ(pair.prefill->key, "127.0.41.2:1");
  }
  const std::vector<std::string> tried{"127.0.41.2:1"};
  PairQuery q{{}, tried, {}, {}, discovery::Clock::now()};
  q.preferred_prefill = "127.0.41.2:1";
  Pair pair;
  ASSERT_TRUE(choose_pair(s, q, *rr, *rr, &pair).is_ok());
  EXPECT_EQ(pair.prefill->key, "127.0.41.1:1");
}

}  // namespace
}  // namespace pdr::router::routing
