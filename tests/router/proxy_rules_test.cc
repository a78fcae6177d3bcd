// The proxy's pure parts: pairing over a snapshot, passive ejection and the retry rules.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "discovery/load_charge.h"
#include "discovery/registry.h"
#include "router/policies/prompt_tokens.h"
#include "router/routing/ejection.h"
#include "router/routing/pairing.h"
#include "router/proxy/retry_rules.h"

namespace pdr::router::proxy {
namespace {

using discovery::Instance;
using discovery::InstanceState;
using discovery::RegistrySnapshot;
using proto::Connector;
using proto::Role;
using proto::TransferMode;

std::shared_ptr<const Instance> node(std::string key, Role role, Connector c, TransferMode m = TransferMode::kNone,
                                     InstanceState state = InstanceState::kUp, std::string model = "") {
  auto i = std::make_shared<Instance>();
  i->key = key;
  i->role = role;
  i->connector = c;
  i->transfer_mode = m;
  i->state = state;
  i->model = std::move(model);
  const auto colon = key.rfind(':');
  i->http_address = proto::HostPort{key.substr(0, colon), static_cast<uint16_t>(std::stoi(key.substr(colon + 1)))};
  return i;
}

RegistrySnapshot snapshot(std::vector<std::shared_ptr<const Instance>> instances) {
  RegistrySnapshot s;
  s.instances = std::move(instances);
  return s;
}

struct Policies {
  std::unique_ptr<Policy> prefill = make_round_robin_policy();
  std::unique_ptr<Policy> decode = make_round_robin_policy();
};

TEST(Pairing, PairsOnlyTheSameConnectorAndMoriioMode) {
  auto s = snapshot({node("127.0.10.1:1", Role::kPrefill, Connector::kMoriio, TransferMode::kRead),
                     node("127.0.10.2:1", Role::kDecode, Connector::kMoriio, TransferMode::kWrite),
                     node("127.0.10.3:1", Role::kDecode, Connector::kNixl)});
  Policies p;
  Pair pair;
  Status st = choose_pair(s, PairQuery{}, *p.prefill, *p.decode, &pair);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("compatible"), std::string::npos) << st.message();
  EXPECT_FALSE(any_pair(s).is_ok());

  auto s2 = snapshot({node("127.0.10.1:1", Role::kPrefill, Connector::kMoriio, TransferMode::kRead),
                      node("127.0.10.2:1", Role::kDecode, Connector::kMoriio, TransferMode::kWrite),
                      node("127.0.10.4:1", Role::kDecode, Connector::kMoriio, TransferMode::kRead)});
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(choose_pair(s2, PairQuery{}, *p.prefill, *p.decode, &pair).is_ok());
    EXPECT_EQ(pair.decode->key, "127.0.10.4:1");
  }
  EXPECT_TRUE(any_pair(s2).is_ok());
}

// Pairing once visited every registry entry per request. With the snapshot's
// RoutableIndex it visits the compatible candidates only, however many incompatible entries the
// registry holds (here 4,096: other connectors, the other MoRIIO mode, other models).
TEST(Pairing, CandidateScanIsBoundedByCompatibleEntries) {
  std::vector<std::shared_ptr<const Instance>> all;
  all.push_back(node("127.0.0.1:1", Role::kPrefill, Connector::kMoriio, TransferMode::kRead, InstanceState::kUp, "m"));
  all.push_back(node("127.0.0.2:1", Role::kDecode, Connector::kMoriio, TransferMode::kRead));
  for (int i = 0; i < 4096; ++i) {
    const std::string key = "127.1." + std::to_string(i / 256) + "." + std::to_string(i % 256) + ":2";
    switch (i % 4) {
      case 0: all.push_back(node(key, Role::kDecode, Connector::kNixl)); break;
      case 1: all.push_back(node(key, Role::kPrefill, Connector::kMoriio, TransferMode::kWrite)); break;
      case 2: all.push_back(node(key, Role::kDecode, Connector::kMoriio, TransferMode::kRead, InstanceState::kUp, "other")); break;
      default: all.push_back(node(key, Role::kPrefill, Connector::kSglang)); break;
    }
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->key < b->key; });
  RegistrySnapshot s = snapshot(all);
  s.routable = discovery::RoutableIndex::build(s.instances);  // as Registry::snapshot() does
  Policies p;
  for (int i = 0; i < 10; ++i) {
    size_t visited = 0;
    PairQuery q;
    q.model = "m";
    q.visited = &visited;
    Pair pair;
    ASSERT_TRUE(choose_pair(s, q, *p.prefill, *p.decode, &pair).is_ok());
    EXPECT_EQ(pair.prefill->key, "127.0.0.1:1");
    EXPECT_EQ(pair.decode->key, "127.0.0.2:1");
    EXPECT_LE(visited, 2u);
    visited = 0;
    InstancePtr decode;
    ASSERT_TRUE(choose_decode(s, *pair.prefill, q, *p.decode, &decode).is_ok());
    EXPECT_LE(visited, 1u);
  }
  EXPECT_TRUE(any_pair(s).is_ok());
  // The hand-made snapshot without an index pairs the same way (index built on the fly).
  RegistrySnapshot plain = snapshot(all);
  Pair pair;
  PairQuery q;
  q.model = "m";
  ASSERT_TRUE(choose_pair(plain, q, *p.prefill, *p.decode, &pair).is_ok());
  EXPECT_EQ(pair.decode->key, "127.0.0.2:1");
}

// The registry builds the index with every snapshot (else pairing would build one per request).
TEST(Pairing, RegistrySnapshotsCarryTheRoutableIndex) {
  discovery::RegistryOptions options;
  discovery::Registry registry(options);
  const auto now = discovery::Clock::now();
  for (auto [port, role] : {std::pair{8001, Role::kPrefill}, std::pair{8002, Role::kDecode}}) {
    config::StaticInstance spec;
    spec.role = role;
    spec.http_address = {"127.0.0.1", static_cast<uint16_t>(port)};
    spec.connector = Connector::kNixl;
    registry.add_admin(spec, now);
  }
  auto snap = registry.snapshot(now);
  ASSERT_TRUE(snap->routable.built);
  ASSERT_EQ(snap->routable.groups.size(), 2u);
  const auto* decodes = snap->routable.find(Role::kDecode, Connector::kNixl, TransferMode::kNone);
  ASSERT_NE(decodes, nullptr);
  EXPECT_EQ(decodes->all.size(), 1u);
  EXPECT_TRUE(any_pair(*snap).is_ok());
}

TEST(Pairing, PrefillChosenOnlyAmongThoseWithACompatibleDecode) {
  auto s = snapshot({node("127.0.10.1:1", Role::kPrefill, Connector::kNixl),
                     node("127.0.10.2:1", Role::kPrefill, Connector::kSglang),
                     node("127.0.10.3:1", Role::kDecode, Connector::kSglang)});
  Policies p;
  for (int i = 0; i < 4; ++i) {
    Pair pair;
    ASSERT_TRUE(choose_pair(s, PairQuery{}, *p.prefill, *p.decode, &pair).is_ok());
    EXPECT_EQ(pair.prefill->key, "127.0.10.2:1");
  }
}

TEST(Pairing, SkipsDrainingExpiredUnknownExcludedAndOtherModels) {
  auto s = snapshot({node("127.0.10.1:1", Role::kPrefill, Connector::kNixl, TransferMode::kNone, InstanceState::kDraining),
                     node("127.0.10.2:1", Role::kPrefill, Connector::kNixl, TransferMode::kNone, InstanceState::kExpired),
                     node("127.0.10.3:1", Role::kPrefill, Connector::kUnknown),
                     node("127.0.10.4:1", Role::kPrefill, Connector::kNixl),
                     node("127.0.10.5:1", Role::kPrefill, Connector::kNixl, TransferMode::kNone, InstanceState::kUp, "other"),
                     node("127.0.10.6:1", Role::kDecode, Connector::kNixl),
                     node("127.0.10.7:1", Role::kDecode, Connector::kNixl, TransferMode::kNone, InstanceState::kUp, "m")});
  Policies p;
  std::map<std::string, int> prefills, decodes;
  for (int i = 0; i < 8; ++i) {
    Pair pair;
    ASSERT_TRUE(choose_pair(s, PairQuery{"m", {}, {}, {}}, *p.prefill, *p.decode, &pair).is_ok());
    ++prefills[pair.prefill->key];
    ++decodes[pair.decode->key];
  }
  EXPECT_EQ(prefills, (std::map<std::string, int>{{"127.0.10.4:1", 8}}));
  EXPECT_EQ(decodes, (std::map<std::string, int>{{"127.0.10.6:1", 4}, {"127.0.10.7:1", 4}}));

  const std::vector<std::string> tried{"127.0.10.4:1"};
  Pair pair;
  Status st = choose_pair(s, PairQuery{"m", tried, {}, {}}, *p.prefill, *p.decode, &pair);
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("already tried"), std::string::npos) << st.message();

  InstancePtr decode;
  const std::vector<std::string> tried_decodes{"127.0.10.6:1"};
  ASSERT_TRUE(choose_decode(s, *s.instances[3], PairQuery{"m", {}, tried_decodes, {}}, *p.decode, &decode).is_ok());
  EXPECT_EQ(decode->key, "127.0.10.7:1");
}

TEST(Pairing, PoliciesSeeLiveOutstandingCounts) {
  auto busy = node("127.0.10.2:1", Role::kDecode, Connector::kSglang);
  busy->liveness->outstanding = 5;
  auto s = snapshot({node("127.0.10.1:1", Role::kPrefill, Connector::kSglang), busy,
                     node("127.0.10.3:1", Role::kDecode, Connector::kSglang)});
  auto prefill_policy = make_round_robin_policy();
  auto decode_policy = make_least_outstanding_policy();
  Pair pair;
  ASSERT_TRUE(choose_pair(s, PairQuery{}, *prefill_policy, *decode_policy, &pair).is_ok());
  EXPECT_EQ(pair.decode->key, "127.0.10.3:1");
}

TEST(Ejection, AfterConnectFailuresInARowUntilTheTimeIsUp) {
  discovery::InstanceLiveness node;
  const EjectionRule rule{3, std::chrono::milliseconds(5000)};
  const auto t0 = discovery::Clock::now();
  for (uint32_t i = 1; i < rule.after; ++i) EXPECT_FALSE(note_connect_failure(node, t0, rule)) << i;
  note_answer(node);  // an answer in between: counting starts again
  EXPECT_EQ(node.connect_failures.load(), 0u);
  for (uint32_t i = 1; i < rule.after; ++i) EXPECT_FALSE(note_connect_failure(node, t0, rule));
  EXPECT_FALSE(ejected(node, t0));
  EXPECT_TRUE(note_connect_failure(node, t0, rule));  // the one that ejects
  EXPECT_TRUE(ejected(node, t0));
  EXPECT_EQ(ejected_for(node, t0), rule.duration + std::chrono::milliseconds(1));
  EXPECT_FALSE(note_connect_failure(node, t0 + std::chrono::seconds(1), rule));  // already ejected
  const auto later = t0 + rule.duration;
  EXPECT_FALSE(ejected(node, later));
  EXPECT_EQ(ejected_for(node, later), std::chrono::milliseconds(0));
  EXPECT_TRUE(note_connect_failure(node, later, rule));  // the probe failed: ejected again at once
  EXPECT_TRUE(ejected(node, later));
  note_answer(node);
  EXPECT_EQ(node.connect_failures.load(), 0u);
  // after = 0: never ejected.
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(note_connect_failure(node, later, EjectionRule{0, rule.duration}));
}

constexpr std::chrono::milliseconds kEjectFor{5000};

void eject(const InstancePtr& node, discovery::Clock::time_point now) {
  const EjectionRule rule{3, kEjectFor};
  for (uint32_t i = 0; i < rule.after; ++i) note_connect_failure(*node->liveness, now, rule);
}

TEST(Pairing, EjectedNodesAreSkippedWhileOthersRemain) {
  const auto now = discovery::Clock::now();
  auto p1 = node("127.0.10.1:1", Role::kPrefill, Connector::kNixl);
  auto p2 = node("127.0.10.2:1", Role::kPrefill, Connector::kNixl);
  auto d1 = node("127.0.10.3:1", Role::kDecode, Connector::kNixl);
  auto d2 = node("127.0.10.4:1", Role::kDecode, Connector::kNixl);
  auto other = node("127.0.10.5:1", Role::kDecode, Connector::kSglang);  // not ejected, incompatible
  auto s = snapshot({p1, p2, d1, d2, other});
  eject(p1, now);
  eject(d1, now);
  Policies p;
  std::map<std::string, int> seen;
  for (int i = 0; i < 6; ++i) {
    Pair pair;
    ASSERT_TRUE(choose_pair(s, PairQuery{{}, {}, {}, {}, now}, *p.prefill, *p.decode, &pair).is_ok());
    ++seen[pair.prefill->key + " " + pair.decode->key];
  }
  EXPECT_EQ(seen, (std::map<std::string, int>{{"127.0.10.2:1 127.0.10.4:1", 6}}));
  // Without a time, ejections are not looked at.
  seen.clear();
  for (int i = 0; i < 4; ++i) {
    Pair pair;
    ASSERT_TRUE(choose_pair(s, PairQuery{}, *p.prefill, *p.decode, &pair).is_ok());
    ++seen[pair.prefill->key];
  }
  EXPECT_EQ(seen.size(), 2u);
  // Every compatible decode ejected: one of them is still tried, although an incompatible decode
  // is not ejected.
  eject(d2, now);
  InstancePtr decode;
  ASSERT_TRUE(choose_decode(s, *p2, PairQuery{{}, {}, {}, {}, now}, *p.decode, &decode).is_ok());
  EXPECT_EQ(decode->connector, Connector::kNixl);
  const std::vector<std::string> tried{"127.0.10.3:1"};
  ASSERT_TRUE(choose_decode(s, *p2, PairQuery{{}, {}, tried, {}, now}, *p.decode, &decode).is_ok());
  EXPECT_EQ(decode->key, "127.0.10.4:1");
  // And once the time is up, they are candidates like any other.
  Pair pair;
  ASSERT_TRUE(choose_pair(s, PairQuery{{}, {}, {}, {}, now + kEjectFor}, *p.prefill, *p.decode, &pair).is_ok());
}

// Each instance's DP ranks take turns, whatever the other instances and legs took: with P and D
// both at dp_size 2, a counter shared by both legs gave the prefill rank 0 every time.
TEST(DpRanks, EachInstanceCyclesThroughItsOwnRanks) {
  auto make = [](std::string key, Role role, uint32_t dp) {
    auto i = std::const_pointer_cast<Instance>(node(std::move(key), role, Connector::kMoriio, TransferMode::kRead));
    i->dp_size = dp;
    return i;
  };
  auto p1 = make("127.0.10.1:1", Role::kPrefill, 2), p2 = make("127.0.10.2:1", Role::kPrefill, 2);
  auto d = make("127.0.10.3:1", Role::kDecode, 2), single = make("127.0.10.4:1", Role::kDecode, 1);
  std::map<std::string, std::vector<uint32_t>> seen;
  for (int request = 0; request < 8; ++request) {
    const auto& prefill = request % 2 == 0 ? p1 : p2;  // a round-robin policy's choice
    seen[prefill->key].push_back(*next_dp_rank(*prefill));
    seen[d->key].push_back(*next_dp_rank(*d));
    EXPECT_FALSE(next_dp_rank(*single).has_value());
  }
  const std::vector<uint32_t> alternating{0, 1, 0, 1};
  EXPECT_EQ(seen[p1->key], alternating);
  EXPECT_EQ(seen[p2->key], alternating);
  EXPECT_EQ(seen[d->key], (std::vector<uint32_t>{0, 1, 0, 1, 0, 1, 0, 1}));
}

TEST(RetryRules, DecodeRetryDependsOnWhetherIdsNameTheDecode) {
  const proto::Dialect& nixl = *proto::dialect_for(Connector::kNixl, proto::TransferMode::kNone);
  const proto::Dialect& moriio = *proto::dialect_for(Connector::kMoriio, proto::TransferMode::kRead);
  const proto::Dialect& mooncake = *proto::dialect_for(Connector::kMooncake, proto::TransferMode::kNone);
  // Every dialect but NIXL names or is pushed to its decode: a whole new pair.
  for (const proto::Dialect* d : proto::all_dialects()) {
    const DecodeRetry want = d == &nixl ? DecodeRetry::kDecodeOnly : DecodeRetry::kWholePair;
    EXPECT_EQ(decode_retry(*d, LegFailure::kConnect, 1), want) << d->name;
    EXPECT_EQ(decode_retry(*d, LegFailure::kStatus5xx, 1), DecodeRetry::kWholePair) << d->name;
    EXPECT_EQ(decode_retry(*d, LegFailure::kStatus4xx, 1), DecodeRetry::kNone) << d->name;
    EXPECT_EQ(decode_retry(*d, LegFailure::kLocalResources, 1), DecodeRetry::kNone) << d->name;
  }
  EXPECT_EQ(decode_retry(nixl, LegFailure::kConnect, 1), DecodeRetry::kDecodeOnly);
  // A NIXL decode that got the request may have pulled, or had the prefill free, the blocks.
  EXPECT_EQ(decode_retry(nixl, LegFailure::kStatus5xx, 1), DecodeRetry::kWholePair);
  EXPECT_EQ(decode_retry(nixl, LegFailure::kTimeout, 1), DecodeRetry::kWholePair);
  EXPECT_EQ(decode_retry(nixl, LegFailure::kConnectionLost, 1), DecodeRetry::kWholePair);
  EXPECT_EQ(decode_retry(moriio, LegFailure::kConnect, 1), DecodeRetry::kWholePair);
  EXPECT_EQ(decode_retry(mooncake, LegFailure::kTimeout, 1), DecodeRetry::kWholePair);
  EXPECT_EQ(decode_retry(nixl, LegFailure::kStatus4xx, 1), DecodeRetry::kNone);
  EXPECT_EQ(decode_retry(moriio, LegFailure::kConnect, 0), DecodeRetry::kNone);
  EXPECT_TRUE(prefill_retryable(LegFailure::kConnectionLost, 1));
  EXPECT_FALSE(prefill_retryable(LegFailure::kStatus4xx, 1));
  EXPECT_FALSE(prefill_retryable(LegFailure::kTimeout, 0));
}

TEST(RetryRules, ClassifiesFailuresAndStatuses) {
  EXPECT_EQ(classify(http::UpstreamFailure::kFirstByteTimeout), LegFailure::kTimeout);
  EXPECT_EQ(classify(http::UpstreamFailure::kIdleTimeout), LegFailure::kTimeout);
  EXPECT_EQ(classify(http::UpstreamFailure::kConnect), LegFailure::kConnect);
  EXPECT_EQ(classify(http::UpstreamFailure::kBadResponse), LegFailure::kBadResponse);
  EXPECT_EQ(classify(http::UpstreamFailure::kConnectionLost), LegFailure::kConnectionLost);
  EXPECT_EQ(classify_status(404), LegFailure::kStatus4xx);
  EXPECT_EQ(classify_status(503), LegFailure::kStatus5xx);
  EXPECT_EQ(classify_status(302), LegFailure::kStatus5xx);
  EXPECT_EQ(failure_status(LegFailure::kTimeout), 504);
  EXPECT_EQ(failure_status(LegFailure::kConnect), 502);
  // pdrouter's own fd shortage: 503, never retried on another node (it would fail the same way).
  EXPECT_EQ(classify(http::UpstreamFailure::kLocalResources), LegFailure::kLocalResources);
  EXPECT_EQ(failure_status(LegFailure::kLocalResources), 503);
  EXPECT_FALSE(prefill_retryable(LegFailure::kLocalResources, 1));
}

TEST(Pairing, APreferredDecodeIsUsedWhileUsable) {
  const auto now = discovery::Clock::now();
  auto p1 = node("127.0.31.1:1", Role::kPrefill, Connector::kNixl);
  auto p2 = node("127.0.31.2:1", Role::kPrefill, Connector::kSglang);
  auto d1 = node("127.0.31.3:1", Role::kDecode, Connector::kNixl);
  auto d2 = node("127.0.31.4:1", Role::kDecode, Connector::kNixl);
  auto d3 = node("127.0.31.5:1", Role::kDecode, Connector::kSglang);
  auto s = snapshot({p1, p2, d1, d2, d3});
  Policies p;
  for (int i = 0; i < 4; ++i) {  // every time, whatever the decode policy's turn
    PairQuery q{{}, {}, {}, {}, now};
    q.preferred_decode = "127.0.31.4:1";
    Pair pair;
    ASSERT_TRUE(choose_pair(s, q, *p.prefill, *p.decode, &pair).is_ok());
    EXPECT_EQ(pair.decode->key, "127.0.31.4:1");
    EXPECT_EQ(pair.prefill->key, "127.0.31.1:1");  // the only prefill compatible with it
  }
  // Excluded (already tried), ejected or unknown: the policies choose as usual.
  std::map<std::string, int> seen;
  const std::vector<std::string> tried{"127.0.31.4:1"};
  for (int i = 0; i < 4; ++i) {
    PairQuery q{{}, {}, tried, {}, now};
    q.preferred_decode = "127.0.31.4:1";
    Pair pair;
    ASSERT_TRUE(choose_pair(s, q, *p.prefill, *p.decode, &pair).is_ok());
    ++seen[pair.decode->key];
  }
  EXPECT_EQ(seen.count("127.0.31.4:1"), 0u);
  eject(d2, now);
  seen.clear();
  for (int i = 0; i < 8; ++i) {
    PairQuery q{{}, {}, {}, {}, now};
    q.preferred_decode = "127.0.31.4:1";
    Pair pair;
    ASSERT_TRUE(choose_pair(s, q, *p.prefill, *p.decode, &pair).is_ok());
    ++seen[pair.decode->key];
  }
  EXPECT_EQ(seen.count("127.0.31.4:1"), 0u);
  PairQuery gone{{}, {}, {}, {}, now};
  gone.preferred_decode = "127.0.31.9:1";
  Pair pair;
  EXPECT_TRUE(choose_pair(s, gone, *p.prefill, *p.decode, &pair).is_ok());
}

// A session's bound prefill or a conversation's decode is used instead of the policy's pick; a
// predicting policy still predicts every candidate, and the explanation names the preferred node
// as chosen (the SLO check reads its prediction), marked as not the policy's choice.
TEST(Pairing, APreferredNodeIsStillPredictedForTheSloCheck) {
  const auto now = discovery::Clock::now();
  auto p1 = node("127.0.32.1:1", Role::kPrefill, Connector::kNixl);
  auto p2 = node("127.0.32.2:1", Role::kPrefill, Connector::kNixl);
  auto d1 = node("127.0.32.3:1", Role::kDecode, Connector::kNixl);
  auto d2 = node("127.0.32.4:1", Role::kDecode, Connector::kNixl);
  auto s = snapshot({p1, p2, d1, d2});
  // The preferred ones are the loaded ones: the policy alone would pick the others.
  discovery::LoadCharge prefill_load(*p2, std::nullopt);
  prefill_load.queue_prefill(50000);
  discovery::LoadCharge decode_load(*d2, std::nullopt);
  decode_load.start_decode(400000);
  config::Topology::Policies config;
  auto prefill = make_policy(config::PolicyName::kPredictedLatency, 1, config, PolicyLeg::kPrefill);
  auto decode = make_policy(config::PolicyName::kPredictedLatency, 1, config, PolicyLeg::kDecode);
  const PromptTokens prompt = count_prompt_tokens("[1,2,3,4]");
  RouteExplanation why;
  PairQuery q{{}, {}, {}, {}, now};
  q.summary.prompt = &prompt;
  q.summary.explain = &why;
  q.preferred_prefill = "127.0.32.2:1";
  q.preferred_decode = "127.0.32.4:1";
  Pair pair;
  ASSERT_TRUE(choose_pair(s, q, *prefill, *decode, &pair).is_ok());
  EXPECT_EQ(pair.prefill->key, "127.0.32.2:1");
  EXPECT_EQ(pair.decode->key, "127.0.32.4:1");
  for (const LegExplanation* leg : {&why.prefill, &why.decode}) {
    ASSERT_TRUE(leg->filled);
    ASSERT_EQ(leg->rows.size(), 2u);
    EXPECT_TRUE(leg->preferred);
    const LegExplanation::Row& chosen = leg->rows[leg->chosen];
    const LegExplanation::Row& other = leg->rows[1 - leg->chosen];
    EXPECT_EQ(chosen.key, leg == &why.prefill ? "127.0.32.2:1" : "127.0.32.4:1");
    EXPECT_GT(chosen.predicted_seconds, other.predicted_seconds);  // its load is in its prediction
  }
  // Without a preference the policy's own picks are not marked.
  RouteExplanation plain;
  PairQuery free_choice{{}, {}, {}, {}, now};
  free_choice.summary.prompt = &prompt;
  free_choice.summary.explain = &plain;
  ASSERT_TRUE(choose_pair(s, free_choice, *prefill, *decode, &pair).is_ok());
  EXPECT_EQ(pair.prefill->key, "127.0.32.1:1");
  EXPECT_EQ(pair.decode->key, "127.0.32.3:1");
  EXPECT_FALSE(plain.prefill.preferred);
  EXPECT_FALSE(plain.decode.preferred);
}

// Records what a policy was shown; picks the first candidate.
class RecordingPolicy final : public Policy {
 public:
  explicit RecordingPolicy(bool needs_load) : needs_load_(needs_load) {}
  size_t pick(std::span<const Candidate> candidates, const RequestSummary&) override {
    seen.assign(candidates.begin(), candidates.end());
    keys.clear();
    for (const Candidate& c : candidates) keys.emplace_back(c.key);
    return 0;
  }
  config::PolicyName name() const override { return config::PolicyName::kPredictedLatency; }
  bool needs_load() const override { return needs_load_; }
  std::vector<Candidate> seen;
  std::vector<std::string> keys;

 private:
  bool needs_load_;
};

// The load ledger reaches the policies that ask for it (predicted_latency), with the node's rate
// estimates: a node with DP ranks as the figures of the rank its next leg goes to, another as its
// totals; the others see zeros.
TEST(Pairing, FillsCandidateLoadOnlyForPoliciesThatNeedIt) {
  auto p1 = node("127.0.30.1:1", Role::kPrefill, Connector::kNixl);
  auto wide = std::make_shared<Instance>(*p1);
  wide->dp_size = 2;
  auto d1 = node("127.0.30.2:1", Role::kDecode, Connector::kNixl);
  auto s = snapshot({wide, d1});
  // Two legs on the prefill's two ranks, one decode sequence.
  discovery::LoadCharge rank0(*wide, 0), rank1(*wide, 1), decode(*d1, std::nullopt);
  rank0.queue_prefill(1000);
  rank1.queue_prefill(500);
  decode.start_decode(700);
  const auto now = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i) wide->liveness->ledger.prefill_tokens_per_second.add(4000, now);
  d1->liveness->ledger.decode_step_seconds.add(0.02, now);

  RecordingPolicy prefill_sees(true), decode_sees(true);
  Pair pair;
  ASSERT_TRUE(choose_pair(s, PairQuery{}, prefill_sees, decode_sees, &pair).is_ok());
  ASSERT_EQ(prefill_sees.seen.size(), 1u);
  const Candidate& p = prefill_sees.seen[0];
  EXPECT_EQ(prefill_sees.keys[0], "127.0.30.1:1");
  EXPECT_EQ(p.outstanding, 2u);
  EXPECT_EQ(p.weight, 2u);
  EXPECT_EQ(p.load.queued_prefill_tokens, 1000u);  // rank 0's: the next leg goes there
  EXPECT_TRUE(p.load.of_next_rank);
  EXPECT_NEAR(p.load.prefill_tokens_per_second, 4000, 1e-6);
  EXPECT_EQ(p.load.decode_step_seconds, 0);  // no estimate yet
  ASSERT_EQ(decode_sees.seen.size(), 1u);
  EXPECT_FALSE(decode_sees.seen[0].load.of_next_rank);  // one rank: its totals
  EXPECT_EQ(decode_sees.seen[0].load.decode_sequences, 1u);
  EXPECT_EQ(decode_sees.seen[0].load.kv_tokens, 700u);
  EXPECT_NEAR(decode_sees.seen[0].load.decode_step_seconds, 0.02, 1e-9);

  // The next leg is pinned to rank 1: its figures.
  EXPECT_EQ(next_dp_rank(*wide), std::optional<uint32_t>(0));
  ASSERT_TRUE(choose_pair(s, PairQuery{}, prefill_sees, decode_sees, &pair).is_ok());
  EXPECT_EQ(prefill_sees.seen[0].load.queued_prefill_tokens, 500u);

  RecordingPolicy blind(false), blind_decode(false);
  ASSERT_TRUE(choose_pair(s, PairQuery{}, blind, blind_decode, &pair).is_ok());
  ASSERT_EQ(blind.seen.size(), 1u);
  EXPECT_EQ(blind.seen[0].outstanding, 2u);  // the load count every policy reads
  EXPECT_EQ(blind.seen[0].load.queued_prefill_tokens, 0u);
  EXPECT_EQ(blind.seen[0].load.prefill_tokens_per_second, 0);
  EXPECT_EQ(blind_decode.seen[0].load.kv_tokens, 0u);

  // A decode retry (choose_decode) fills them too.
  InstancePtr next;
  ASSERT_TRUE(choose_decode(s, *wide, PairQuery{}, decode_sees, &next).is_ok());
  EXPECT_EQ(decode_sees.seen[0].load.kv_tokens, 700u);
  EXPECT_EQ(decode_sees.seen[0].load.other_requests, 0u);  // no scrape: the ledger alone
  EXPECT_LT(decode_sees.seen[0].load.kv_cache_usage, 0);

  // The decode's own page (the load scrape), fresh: 5 running + 2 waiting, 1 of them pdrouter's
  // when it was read, so 6 of other clients'; its KV usage as reported.
  proto::EngineLoadPage page;
  page.outcome = proto::EngineLoadPage::Outcome::kOk;
  page.node = {5, 2, 0.4};
  d1->liveness->engine_load.store(page, 1, d1->liveness->ledger, now, std::chrono::seconds(3));
  RecordingPolicy scraped(true);
  ASSERT_TRUE(choose_decode(s, *wide, PairQuery{}, scraped, &next).is_ok());
  EXPECT_EQ(scraped.seen[0].load.other_requests, 6u);
  EXPECT_NEAR(scraped.seen[0].load.kv_cache_usage, 0.4, 1e-12);
  EXPECT_EQ(scraped.seen[0].load.kv_tokens, 700u);  // the ledger's, kept
  // Once stale, the ledger alone again.
  d1->liveness->engine_load.store(page, 1, d1->liveness->ledger, now - std::chrono::seconds(10),
                                  std::chrono::seconds(3));
  RecordingPolicy stale(true);
  ASSERT_TRUE(choose_decode(s, *wide, PairQuery{}, stale, &next).is_ok());
  EXPECT_EQ(stale.seen[0].load.other_requests, 0u);
  EXPECT_LT(stale.seen[0].load.kv_cache_usage, 0);
}

}  // namespace
}  // namespace pdr::router::proxy
