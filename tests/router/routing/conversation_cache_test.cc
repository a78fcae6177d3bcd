#include "router/routing/conversation_cache.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <vector>

namespace pdr::router::routing {
namespace {

using namespace std::chrono_literals;
using Clock = ConversationCache::Clock;

ConversationCache::Entry entry(std::string decode, std::string params = R"({"remote_block_ids":[1]})") {
  return ConversationCache::Entry{std::move(decode), 7, std::move(params)};
}

// A conversation of the anonymous client, or of `binding`. Views: ids and bindings are literals
// or live in the test's vectors.
ConversationCache::Key K(std::string_view id, std::string_view binding = {}) { return {binding, id}; }

const std::vector<std::string> ids = {"c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9"};
const std::vector<std::string> remote_ids = {"r0", "r1", "r2", "r3", "r4"};

ConversationCache::Limits limits(size_t max_entries = 100, size_t max_bytes = 1 << 20) {
  ConversationCache::Limits l;
  l.ttl = 450s;
  l.max_entries = max_entries;
  l.max_bytes = max_bytes;
  return l;
}

TEST(ConversationCache, AnEntryIsTakenOnce) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put(K("c1"), entry("127.0.30.1:8000"), t0, limits());
  auto got = cache.take(K("c1"), t0 + 1s, 450s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->decode_key, "127.0.30.1:8000");
  EXPECT_EQ(got->decode_epoch, 7u);
  EXPECT_FALSE(cache.take(K("c1"), t0 + 2s, 450s).has_value());
  const auto st = cache.stats();
  EXPECT_EQ(st.stored, 1u);
  EXPECT_EQ(st.taken, 1u);
  EXPECT_EQ(st.missing, 1u);
  EXPECT_EQ(st.entries, 0u);
  EXPECT_EQ(st.bytes, 0u);
}

TEST(ConversationCache, AnExpiredEntryIsNeverHandedOut) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put(K("c1"), entry("127.0.30.1:8000"), t0, limits());
  EXPECT_FALSE(cache.take(K("c1"), t0 + 450s, 450s).has_value());
  EXPECT_EQ(cache.stats().expired, 1u);
  // A shorter ttl from a reload applies at once.
  cache.put(K("c2"), entry("127.0.30.1:8000"), t0, limits());
  EXPECT_FALSE(cache.take(K("c2"), t0 + 11s, 10s).has_value());
}

TEST(ConversationCache, ANewTurnReplacesTheEntry) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put(K("c1"), entry("127.0.30.1:8000"), t0, limits());
  cache.put(K("c1"), entry("127.0.30.2:8000"), t0, limits());
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_EQ(cache.take(K("c1"), t0, 450s)->decode_key, "127.0.30.2:8000");
}

TEST(ConversationCache, CountAndBytesAreBoundedOldestFirst) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) cache.put(K(ids[i]), entry("127.0.30.1:8000"), t0, limits(3));
  auto st = cache.stats();
  EXPECT_EQ(st.entries, 3u);
  EXPECT_EQ(st.evicted, 2u);
  EXPECT_FALSE(cache.take(K("c0"), t0, 450s).has_value());
  EXPECT_FALSE(cache.take(K("c1"), t0, 450s).has_value());
  EXPECT_TRUE(cache.take(K("c4"), t0, 450s).has_value());

  ConversationCache small;
  const std::string params(400, 'x');
  for (int i = 0; i < 10; ++i) small.put(K(ids[i]), entry("127.0.30.1:8000", params), t0, limits(100, 1000));
  st = small.stats();
  EXPECT_LE(st.bytes, 1000u);
  EXPECT_EQ(st.entries, 2u);
  // One entry over the whole budget is not kept.
  small.put(K("huge"), entry("127.0.30.1:8000", std::string(2000, 'x')), t0, limits(100, 1000));
  EXPECT_FALSE(small.take(K("huge"), t0, 450s).has_value());
}

TEST(ConversationCache, ExpiredEntriesGoWhenOthersArrive) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put(K("old"), entry("127.0.30.1:8000"), t0, limits());
  cache.put(K("new"), entry("127.0.30.1:8000"), t0 + 451s, limits());
  const auto st = cache.stats();
  EXPECT_EQ(st.entries, 1u);
  EXPECT_EQ(st.expired, 1u);
}

// Bindings (conversation_binding.h) are digests; any distinct byte strings do here.
constexpr std::string_view kAlice = "alice-binding-32-bytes-long-xxxx";
constexpr std::string_view kMallory = "mallory-binding-32-bytes-long-xx";

TEST(ConversationCache, AnotherClientsTurnWithTheSameIdFindsNothingAndTouchesNothing) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put(K("conv-1", kAlice), entry("127.0.30.1:8000", R"({"remote_block_ids":[5,6]})"), t0, limits());
  bool other = false;
  EXPECT_FALSE(cache.take(K("conv-1", kMallory), t0 + 1s, 450s, &other).has_value());
  EXPECT_TRUE(other);
  EXPECT_FALSE(cache.take(K("conv-1"), t0 + 1s, 450s, &other).has_value());  // anonymous: another client too
  EXPECT_TRUE(other);
  // Mallory's own entry goes beside Alice's, not over it.
  cache.put(K("conv-1", kMallory), entry("127.0.30.2:8000", R"({"remote_block_ids":[9]})"), t0 + 2s, limits());
  auto st = cache.stats();
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.other_binding, 2u);
  EXPECT_EQ(st.missing, 2u);
  auto alice = cache.take(K("conv-1", kAlice), t0 + 3s, 450s, &other);
  ASSERT_TRUE(alice.has_value());
  EXPECT_FALSE(other);
  EXPECT_EQ(alice->decode_key, "127.0.30.1:8000");
  EXPECT_EQ(alice->prefill_params, R"({"remote_block_ids":[5,6]})");
  auto mallory = cache.take(K("conv-1", kMallory), t0 + 3s, 450s);
  ASSERT_TRUE(mallory.has_value());
  EXPECT_EQ(mallory->decode_key, "127.0.30.2:8000");
  // Nobody holds the id any more: a plain miss.
  EXPECT_FALSE(cache.take(K("conv-1", kMallory), t0 + 4s, 450s, &other).has_value());
  EXPECT_FALSE(other);
  st = cache.stats();
  EXPECT_EQ(st.entries, 0u);
  EXPECT_EQ(st.bytes, 0u);
  EXPECT_EQ(st.other_binding, 2u);
}

TEST(ConversationCache, TheSameClientReusesItsEntry) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put(K("conv-1", kAlice), entry("127.0.30.1:8000"), t0, limits());
  cache.put(K("conv-1", kAlice), entry("127.0.30.3:8000"), t0, limits());  // her next turn replaces it
  EXPECT_EQ(cache.stats().entries, 1u);
  bool other = true;
  auto got = cache.take(K("conv-1", kAlice), t0 + 1s, 450s, &other);
  ASSERT_TRUE(got.has_value());
  EXPECT_FALSE(other);
  EXPECT_EQ(got->decode_key, "127.0.30.3:8000");
  // Anonymous requests share the anonymous binding.
  cache.put(K("conv-2"), entry("127.0.30.1:8000"), t0, limits());
  EXPECT_TRUE(cache.take(K("conv-2"), t0 + 1s, 450s).has_value());
}

TEST(ConversationCache, EvictionsAndForgetsKeepThePerIdCountRight) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put(K("conv-1", kAlice), entry("127.0.30.1:8000"), t0, limits(2));
  EXPECT_TRUE(cache.mirror(K("conv-1", kMallory), entry("127.0.30.2:8000"), t0, t0, limits(2)));
  EXPECT_TRUE(cache.forget(K("conv-1", kMallory)));
  EXPECT_FALSE(cache.forget(K("conv-1", kMallory)));
  bool other = false;
  EXPECT_FALSE(cache.take(K("conv-1", kMallory), t0, 450s, &other).has_value());
  EXPECT_TRUE(other);  // Alice's is still there
  cache.put(K("a"), entry("127.0.30.1:8000"), t0, limits(2));
  cache.put(K("b"), entry("127.0.30.1:8000"), t0, limits(2));  // evicts Alice's, the oldest
  EXPECT_FALSE(cache.take(K("conv-1", kMallory), t0, 450s, &other).has_value());
  EXPECT_FALSE(other);
}

// What the cache hands to its replication (registry.backend etcd).
struct Recorder : ConversationCache::Replication {
  std::vector<std::string> log;
  void stored(const ConversationCache::Key& key, const ConversationCache::Entry& e,
              std::chrono::milliseconds ttl) override {
    log.push_back("stored " + std::string(key.binding) + "/" + std::string(key.id) + " " + e.decode_key + " " +
                  std::to_string(ttl.count()));
  }
  void taken(const ConversationCache::Key& key) override {
    log.push_back("taken " + std::string(key.binding) + "/" + std::string(key.id));
  }
};

TEST(ConversationCache, LocalPutsAndTakesGoToTheReplicationMirroredOnesDoNot) {
  ConversationCache cache;
  Recorder r;
  cache.set_replication(&r);
  const auto t0 = Clock::now();
  cache.put(K("local"), entry("127.0.30.1:8000"), t0, limits());
  EXPECT_TRUE(cache.mirror(K("remote"), entry("127.0.30.2:8000"), t0, t0, limits()));
  EXPECT_TRUE(cache.take(K("remote"), t0 + 1s, 450s).has_value());
  EXPECT_FALSE(cache.take(K("absent"), t0 + 1s, 450s).has_value());
  EXPECT_TRUE(cache.forget(K("local")));
  EXPECT_FALSE(cache.forget(K("local")));
  EXPECT_EQ(r.log, (std::vector<std::string>{"stored /local 127.0.30.1:8000 450000", "taken /remote"}));
}

TEST(ConversationCache, MirroredEntriesAreMarkedCountedAndAged) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put(K("mine"), entry("127.0.30.1:8000"), t0, limits());
  EXPECT_TRUE(cache.mirror(K("theirs"), entry("127.0.30.2:8000"), t0 - 400s, t0, limits()));
  EXPECT_FALSE(cache.mirror(K("old"), entry("127.0.30.2:8000"), t0 - 450s, t0, limits()));  // already expired
  auto st = cache.stats();
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.remote_entries, 1u);
  // Stored 400 s before t0 on the writer's clock: gone 50 s later.
  EXPECT_FALSE(cache.take(K("theirs"), t0 + 51s, 450s).has_value());
  EXPECT_EQ(cache.stats().remote_entries, 0u);
  // A local put replaces a mirrored entry and is no longer remote.
  EXPECT_TRUE(cache.mirror(K("c"), entry("127.0.30.2:8000"), t0, t0, limits()));
  cache.put(K("c"), entry("127.0.30.3:8000"), t0, limits());
  st = cache.stats();
  EXPECT_EQ(st.remote_entries, 0u);
  auto got = cache.take(K("c"), t0, 450s);
  ASSERT_TRUE(got.has_value());
  EXPECT_FALSE(got->remote);
  EXPECT_EQ(got->decode_key, "127.0.30.3:8000");
}

TEST(ConversationCache, MirroredEntriesObeyTheLimitsAndAResyncDropsVanishedOnes) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  EXPECT_FALSE(cache.mirror(K("huge"), entry("127.0.30.2:8000", std::string(2000, 'x')), t0, t0, limits(100, 1000)));
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(cache.mirror(K(remote_ids[i]), entry("127.0.30.2:8000"), t0, t0, limits(3)));
  }
  EXPECT_EQ(cache.stats().entries, 3u);
  EXPECT_EQ(cache.stats().remote_entries, 3u);
  cache.put(K("local"), entry("127.0.30.1:8000"), t0, limits());
  EXPECT_EQ(cache.drop_remote_except({ConversationCache::slot_key(K("r4"))}), 2u);
  const auto st = cache.stats();
  EXPECT_EQ(st.entries, 2u);  // r4 and local
  EXPECT_EQ(st.remote_entries, 1u);
  EXPECT_TRUE(cache.take(K("local"), t0, 450s).has_value());
  EXPECT_TRUE(cache.take(K("r4"), t0, 450s).has_value());
}

}  // namespace
}  // namespace pdr::router::routing
