#include "router/policies/policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

namespace pdr::router {
namespace {

using config::PolicyName;

// Owns the key strings the Candidate views point into.
struct Pool {
  std::vector<std::string> keys;
  std::vector<Candidate> candidates;

  explicit Pool(std::vector<uint32_t> outstanding) {
    keys.reserve(outstanding.size());
    for (size_t i = 0; i < outstanding.size(); ++i) keys.push_back(address(i));
    for (size_t i = 0; i < outstanding.size(); ++i) candidates.push_back({keys[i], outstanding[i]});
  }
  static Pool idle(size_t n) { return Pool(std::vector<uint32_t>(n, 0)); }
  static std::string address(size_t i) { return "127.0.10." + std::to_string(i + 1) + ":8000"; }

  std::span<const Candidate> span() const { return candidates; }
};

RequestSummary keyed(uint64_t i) { return {affinity_hash("session-" + std::to_string(i)), true}; }

// ---- round_robin ----------------------------------------------------------------------------

TEST(RoundRobin, SpreadsExactlyEvenly) {
  auto policy = make_policy(PolicyName::kRoundRobin, 1);
  EXPECT_EQ(policy->name(), PolicyName::kRoundRobin);
  Pool pool = Pool::idle(5);
  std::vector<int> hits(5);
  for (int i = 0; i < 5 * 1000; ++i) ++hits.at(policy->pick(pool.span(), {}));
  for (int h : hits) EXPECT_EQ(h, 1000);
}

TEST(RoundRobin, IgnoresLoadAndSurvivesListChanges) {
  auto policy = make_round_robin_policy();
  Pool big({100, 0, 0, 0, 0, 0, 0});
  Pool one = Pool::idle(1);
  for (int i = 0; i < 100; ++i) {
    EXPECT_LT(policy->pick(big.span(), {}), 7u);
    EXPECT_EQ(policy->pick(one.span(), {}), 0u);
  }
  // Rotation continues over a shrunken list.
  Pool three = Pool::idle(3);
  std::vector<int> hits(3);
  for (int i = 0; i < 300; ++i) ++hits.at(policy->pick(three.span(), {}));
  for (int h : hits) EXPECT_EQ(h, 100);
}

TEST(RoundRobin, ConcurrentPicksGiveExactTotals) {
  auto policy = make_round_robin_policy();
  Pool pool = Pool::idle(4);
  constexpr int kThreads = 4;
  constexpr int kPicks = 100000;
  std::array<std::array<int, 4>, kThreads> hits{};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPicks; ++i) ++hits[t][policy->pick(pool.span(), {})];
    });
  }
  for (auto& th : threads) th.join();
  for (size_t c = 0; c < 4; ++c) {
    int total = 0;
    for (int t = 0; t < kThreads; ++t) total += hits[t][c];
    EXPECT_EQ(total, kThreads * kPicks / 4) << "candidate " << c;
  }
}

// ---- least_outstanding ----------------------------------------------------------------------

TEST(LeastOutstanding, PicksTheMinimum) {
  auto policy = make_policy(PolicyName::kLeastOutstanding, 1);
  EXPECT_EQ(policy->name(), PolicyName::kLeastOutstanding);
  Pool pool({5, 3, 1, 7, 2});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(policy->pick(pool.span(), {}), 2u);
  Pool first({0, 3, 1});
  EXPECT_EQ(policy->pick(first.span(), {}), 0u);
  Pool last({4, 3, 1, 0});
  EXPECT_EQ(policy->pick(last.span(), {}), 3u);
  EXPECT_EQ(policy->pick(Pool({9}).span(), {}), 0u);
}

TEST(LeastOutstanding, RotatesTiesFairly) {
  auto policy = make_least_outstanding_policy();
  Pool pool({3, 1, 1, 9, 1});
  std::map<size_t, int> hits;
  for (int i = 0; i < 300; ++i) ++hits[policy->pick(pool.span(), {})];
  EXPECT_EQ(hits, (std::map<size_t, int>{{1, 100}, {2, 100}, {4, 100}}));
}

TEST(LeastOutstanding, ComparesLoadPerUnitWeight) {
  auto policy = make_least_outstanding_policy();
  Pool pool({4, 3});
  pool.candidates[0].weight = 2;  // 4/2 = 2 < 3/1
  EXPECT_EQ(policy->pick(pool.span(), {}), 0u);
  pool.candidates[0].weight = 0;  // treated as 1: 4 > 3
  EXPECT_EQ(policy->pick(pool.span(), {}), 1u);
}

// ---- power_of_two ---------------------------------------------------------------------------

TEST(PowerOfTwo, NeverPicksTheStrictMaximumOfTwo) {
  auto policy = make_policy(PolicyName::kPowerOfTwo, 42);
  EXPECT_EQ(policy->name(), PolicyName::kPowerOfTwo);
  Pool a({10, 3});
  Pool b({3, 10});
  for (int i = 0; i < 10000; ++i) {
    ASSERT_EQ(policy->pick(a.span(), {}), 1u);
    ASSERT_EQ(policy->pick(b.span(), {}), 0u);
  }
  // With distinct draws the single heaviest of many can never win either.
  Pool many({2, 2, 9, 2, 2});
  for (int i = 0; i < 10000; ++i) ASSERT_NE(policy->pick(many.span(), {}), 2u);
}

TEST(PowerOfTwo, SingleCandidateIsIndexZero) {
  auto policy = make_power_of_two_policy(7);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(policy->pick(Pool({5}).span(), {}), 0u);
}

TEST(PowerOfTwo, UniformAmongEqualCandidates) {
  auto policy = make_power_of_two_policy(12345);
  constexpr size_t kN = 8;
  constexpr int kPicks = 80000;
  Pool pool = Pool::idle(kN);
  std::array<int, kN> hits{};
  for (int i = 0; i < kPicks; ++i) ++hits.at(policy->pick(pool.span(), {}));
  const double expected = double(kPicks) / kN;
  double chi2 = 0;
  for (int h : hits) chi2 += (h - expected) * (h - expected) / expected;
  // 7 degrees of freedom: P(chi2 > 24.32) = 0.001. The seed is fixed, so this is deterministic.
  EXPECT_LT(chi2, 24.32);
}

TEST(PowerOfTwo, DrawsTwoDistinctCandidates) {
  // One idle node among four: it wins exactly when it is one of the two draws, which is
  // 1 - C(3,2)/C(4,2) = 1/2 for distinct draws (7/16 if draws could repeat).
  auto policy = make_power_of_two_policy(99);
  Pool pool({1, 1, 1, 0});
  constexpr int kPicks = 40000;
  int idle = 0;
  for (int i = 0; i < kPicks; ++i) idle += policy->pick(pool.span(), {}) == 3;
  EXPECT_NEAR(double(idle) / kPicks, 0.5, 0.015);
}

TEST(PowerOfTwo, SameSeedSameSequence) {
  auto a = make_power_of_two_policy(5);
  auto b = make_power_of_two_policy(5);
  auto c = make_power_of_two_policy(6);
  Pool pool = Pool::idle(16);
  int differ = 0;
  for (int i = 0; i < 1000; ++i) {
    const size_t pa = a->pick(pool.span(), {});
    ASSERT_EQ(pa, b->pick(pool.span(), {}));
    differ += pa != c->pick(pool.span(), {});
  }
  EXPECT_GT(differ, 500);
}

// ---- affinity -------------------------------------------------------------------------------

std::vector<std::string> owners(Policy& policy, const Pool& pool, int keys) {
  std::vector<std::string> out;
  out.reserve(keys);
  for (int k = 0; k < keys; ++k) out.push_back(pool.keys.at(policy.pick(pool.span(), keyed(k))));
  return out;
}

TEST(Affinity, SameKeySameNodeRegardlessOfLoadAndOrder) {
  auto policy = make_policy(PolicyName::kAffinity, 1);
  EXPECT_EQ(policy->name(), PolicyName::kAffinity);
  Pool pool = Pool::idle(4);
  Pool reversed = pool;
  std::reverse(reversed.candidates.begin(), reversed.candidates.end());
  for (int k = 0; k < 1000; ++k) {
    const size_t first = policy->pick(pool.span(), keyed(k));
    for (int call = 0; call < 3; ++call) {
      pool.candidates[call].outstanding += 17;  // load does not move a key
      ASSERT_EQ(policy->pick(pool.span(), keyed(k)), first);
    }
    ASSERT_EQ(reversed.candidates[policy->pick(reversed.span(), keyed(k))].key,
              pool.candidates[first].key);
  }
}

TEST(Affinity, SpreadsKeysEvenly) {
  auto policy = make_affinity_policy();
  Pool pool = Pool::idle(4);
  std::map<std::string, int> share;
  for (const std::string& owner : owners(*policy, pool, 10000)) ++share[owner];
  ASSERT_EQ(share.size(), 4u);
  for (const auto& [key, n] : share) {
    EXPECT_GT(n, 2200) << key;
    EXPECT_LT(n, 2800) << key;
  }
}

TEST(Affinity, AddingANodeMovesOnlyItsShare) {
  auto policy = make_affinity_policy();
  constexpr int kKeys = 10000;
  const auto before = owners(*policy, Pool::idle(4), kKeys);
  const Pool five = Pool::idle(5);
  const auto after = owners(*policy, five, kKeys);
  int moved = 0;
  for (int k = 0; k < kKeys; ++k) {
    if (before[k] == after[k]) continue;
    ++moved;
    EXPECT_EQ(after[k], five.keys[4]) << "key " << k << " moved between old nodes";
  }
  EXPECT_GT(moved, kKeys * 10 / 100);
  EXPECT_LT(moved, kKeys * 30 / 100);
}

TEST(Affinity, RemovingANodeMovesOnlyItsKeys) {
  auto policy = make_affinity_policy();
  constexpr int kKeys = 10000;
  Pool pool = Pool::idle(5);
  const auto before = owners(*policy, pool, kKeys);
  const std::string removed = pool.keys[2];
  pool.candidates.erase(pool.candidates.begin() + 2);
  int moved = 0;
  for (int k = 0; k < kKeys; ++k) {
    const std::string now(pool.candidates[policy->pick(pool.span(), keyed(k))].key);
    if (before[k] == removed) {
      EXPECT_NE(now, removed);
      ++moved;
    } else {
      EXPECT_EQ(now, before[k]) << "key " << k;
    }
  }
  EXPECT_GT(moved, 0);
}

TEST(Affinity, AnyPoolSizeIsSafe) {
  auto policy = make_affinity_policy();
  for (size_t n = 1; n <= 6; ++n) {
    Pool pool = Pool::idle(n);
    for (int k = 0; k < 500; ++k) ASSERT_LT(policy->pick(pool.span(), keyed(k)), n);
  }
  EXPECT_EQ(policy->pick(Pool::idle(1).span(), keyed(1)), 0u);
}

TEST(Affinity, WithoutKeyFallsBackToLeastOutstanding) {
  auto policy = make_affinity_policy();
  Pool pool({4, 1, 6});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(policy->pick(pool.span(), {}), 1u);
  Pool ties({2, 2});
  std::array<int, 2> hits{};
  for (int i = 0; i < 100; ++i) ++hits.at(policy->pick(ties.span(), {}));
  EXPECT_EQ(hits[0], 50);
  EXPECT_EQ(hits[1], 50);
}

TEST(Affinity, WeightScalesShare) {
  auto policy = make_affinity_policy();
  Pool pool = Pool::idle(3);
  pool.candidates[2].weight = 2;
  std::array<int, 3> hits{};
  for (int k = 0; k < 20000; ++k) ++hits.at(policy->pick(pool.span(), keyed(k)));
  EXPECT_NEAR(hits[0] / 20000.0, 0.25, 0.02);
  EXPECT_NEAR(hits[1] / 20000.0, 0.25, 0.02);
  EXPECT_NEAR(hits[2] / 20000.0, 0.50, 0.02);
}

// ---- affinity keys --------------------------------------------------------------------------

// xxHash's own sanity buffer and vectors (cli/xsum_sanity_check.c in older releases: 101 bytes).
TEST(AffinityHash, MatchesXxh64ReferenceVectors) {
  std::string buffer(101, '\0');
  uint32_t gen = 2654435761U;
  for (char& c : buffer) {
    c = static_cast<char>(gen >> 24);
    gen *= gen;
  }
  const uint64_t prime = 2654435761U;
  EXPECT_EQ(affinity_hash(""), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(affinity_hash("", prime), 0xAC75FDA2929B17EFULL);
  EXPECT_EQ(affinity_hash(std::string_view(buffer).substr(0, 1)), 0x4FCE394CC88952D8ULL);
  EXPECT_EQ(affinity_hash(std::string_view(buffer).substr(0, 1), prime), 0x739840CB819FA723ULL);
  EXPECT_EQ(affinity_hash(std::string_view(buffer).substr(0, 14)), 0xCFFA8DB881BC3A3DULL);
  EXPECT_EQ(affinity_hash(std::string_view(buffer).substr(0, 14), prime), 0x5B9611585EFCC9CBULL);
  EXPECT_EQ(affinity_hash(buffer), 0x0EAB543384F878ADULL);
  EXPECT_EQ(affinity_hash(buffer, prime), 0xCAA65939306F1E21ULL);
  EXPECT_EQ(affinity_hash("a"), 0xD24EC4F1A98C6E5BULL);
  EXPECT_EQ(affinity_hash("abc"), 0x44BC2CF5AD770999ULL);
}

TEST(AffinityKey, EmptySourcesGiveNoAffinity) {
  EXPECT_FALSE(affinity_from_header("").has_affinity);
  EXPECT_FALSE(affinity_from_session("", "").has_affinity);
  EXPECT_FALSE(affinity_from_prompt_prefix("", 256).has_affinity);
  EXPECT_FALSE(affinity_from_prompt_prefix("hello", 0).has_affinity);
  EXPECT_FALSE(summarize_affinity({}, 256).has_affinity);
}

TEST(AffinityKey, SourcesHashTheirBytes) {
  EXPECT_EQ(affinity_from_header("tenant-7").affinity_hash, affinity_hash("tenant-7"));
  EXPECT_EQ(affinity_from_session("conv", "bob").affinity_hash, affinity_hash("conv"));
  EXPECT_EQ(affinity_from_session("", "bob").affinity_hash, affinity_hash("bob"));
  EXPECT_TRUE(affinity_from_session("", "bob").has_affinity);
}

TEST(AffinityKey, PromptPrefixIgnoresBytesPastTheLimit) {
  const std::string system(300, 's');
  const auto a = affinity_from_prompt_prefix(system + " question one", 256);
  const auto b = affinity_from_prompt_prefix(system + " another question", 256);
  EXPECT_TRUE(a.has_affinity);
  EXPECT_EQ(a.affinity_hash, b.affinity_hash);
  EXPECT_EQ(a.affinity_hash, affinity_hash(std::string_view(system).substr(0, 256)));
  // Shorter than the limit: the whole prompt.
  EXPECT_EQ(affinity_from_prompt_prefix("short", 256).affinity_hash, affinity_hash("short"));
  EXPECT_NE(affinity_from_prompt_prefix("short", 256).affinity_hash,
            affinity_from_prompt_prefix("shore", 256).affinity_hash);
}

TEST(AffinityKey, PrecedenceIsHeaderConversationUserPrompt) {
  AffinityInputs in{"hdr", "conv", "user", "prompt"};
  EXPECT_EQ(summarize_affinity(in, 256).affinity_hash, affinity_hash("hdr"));
  in.header_value = {};
  EXPECT_EQ(summarize_affinity(in, 256).affinity_hash, affinity_hash("conv"));
  in.conversation_id = {};
  EXPECT_EQ(summarize_affinity(in, 256).affinity_hash, affinity_hash("user"));
  in.user = {};
  EXPECT_EQ(summarize_affinity(in, 3).affinity_hash, affinity_hash("pro"));
  EXPECT_FALSE(summarize_affinity(in, 0).has_affinity);
}

// ---- all policies under concurrency (meaningful under TSan) ---------------------------------

TEST(Policies, ConcurrentPicksStayInRange) {
  for (PolicyName name : {PolicyName::kRoundRobin, PolicyName::kLeastOutstanding, PolicyName::kPowerOfTwo,
                          PolicyName::kAffinity, PolicyName::kCacheAware, PolicyName::kPredictedLatency}) {
    auto policy = make_policy(name, 3);
    Pool pool({1, 0, 0, 2, 0});
    std::vector<std::thread> threads;
    std::array<bool, 4> ok{};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        bool in_range = true;
        for (int i = 0; i < 20000; ++i) {
          const RequestSummary request = i % 2 ? keyed(i) : RequestSummary{};
          in_range &= policy->pick(pool.span(), request) < 5;
        }
        ok[t] = in_range;
      });
    }
    for (auto& th : threads) th.join();
    for (bool b : ok) EXPECT_TRUE(b) << config::to_string(name);
  }
}

}  // namespace
}  // namespace pdr::router
