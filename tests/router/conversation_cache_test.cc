#include "router/proxy/conversation_cache.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pdr::router::proxy {
namespace {

using namespace std::chrono_literals;
using Clock = ConversationCache::Clock;

ConversationCache::Entry entry(std::string decode, std::string params = R"({"remote_block_ids":[1]})") {
  return ConversationCache::Entry{std::move(decode), 7, std::move(params)};
}

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
  cache.put("c1", entry("127.0.30.1:8000"), t0, limits());
  auto got = cache.take("c1", t0 + 1s, 450s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->decode_key, "127.0.30.1:8000");
  EXPECT_EQ(got->decode_epoch, 7u);
  EXPECT_FALSE(cache.take("c1", t0 + 2s, 450s).has_value());
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
  cache.put("c1", entry("127.0.30.1:8000"), t0, limits());
  EXPECT_FALSE(cache.take("c1", t0 + 450s, 450s).has_value());
  EXPECT_EQ(cache.stats().expired, 1u);
  // A shorter ttl from a reload applies at once.
  cache.put("c2", entry("127.0.30.1:8000"), t0, limits());
  EXPECT_FALSE(cache.take("c2", t0 + 11s, 10s).has_value());
}

TEST(ConversationCache, ANewTurnReplacesTheEntry) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put("c1", entry("127.0.30.1:8000"), t0, limits());
  cache.put("c1", entry("127.0.30.2:8000"), t0, limits());
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_EQ(cache.take("c1", t0, 450s)->decode_key, "127.0.30.2:8000");
}

TEST(ConversationCache, CountAndBytesAreBoundedOldestFirst) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) cache.put("c" + std::to_string(i), entry("127.0.30.1:8000"), t0, limits(3));
  auto st = cache.stats();
  EXPECT_EQ(st.entries, 3u);
  EXPECT_EQ(st.evicted, 2u);
  EXPECT_FALSE(cache.take("c0", t0, 450s).has_value());
  EXPECT_FALSE(cache.take("c1", t0, 450s).has_value());
  EXPECT_TRUE(cache.take("c4", t0, 450s).has_value());

  ConversationCache small;
  const std::string params(400, 'x');
  for (int i = 0; i < 10; ++i) small.put("c" + std::to_string(i), entry("127.0.30.1:8000", params), t0, limits(100, 1000));
  st = small.stats();
  EXPECT_LE(st.bytes, 1000u);
  EXPECT_EQ(st.entries, 2u);
  // One entry over the whole budget is not kept.
  small.put("huge", entry("127.0.30.1:8000", std::string(2000, 'x')), t0, limits(100, 1000));
  EXPECT_FALSE(small.take("huge", t0, 450s).has_value());
}

TEST(ConversationCache, ExpiredEntriesGoWhenOthersArrive) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put("old", entry("127.0.30.1:8000"), t0, limits());
  cache.put("new", entry("127.0.30.1:8000"), t0 + 451s, limits());
  const auto st = cache.stats();
  EXPECT_EQ(st.entries, 1u);
  EXPECT_EQ(st.expired, 1u);
}

// What the cache hands to its replication (registry.backend etcd).
struct Recorder : ConversationCache::Replication {
  std::vector<std::string> log;
  void stored(std::string_view id, const ConversationCache::Entry& e, std::chrono::milliseconds ttl) override {
    log.push_back("stored " + std::string(id) + " " + e.decode_key + " " + std::to_string(ttl.count()));
  }
  void taken(std::string_view id) override { log.push_back("taken " + std::string(id)); }
};

TEST(ConversationCache, LocalPutsAndTakesGoToTheReplicationMirroredOnesDoNot) {
  ConversationCache cache;
  Recorder r;
  cache.set_replication(&r);
  const auto t0 = Clock::now();
  cache.put("local", entry("127.0.30.1:8000"), t0, limits());
  EXPECT_TRUE(cache.mirror("remote", entry("127.0.30.2:8000"), t0, t0, limits()));
  EXPECT_TRUE(cache.take("remote", t0 + 1s, 450s).has_value());
  EXPECT_FALSE(cache.take("absent", t0 + 1s, 450s).has_value());
  EXPECT_TRUE(cache.forget("local"));
  EXPECT_FALSE(cache.forget("local"));
  EXPECT_EQ(r.log, (std::vector<std::string>{"stored local 127.0.30.1:8000 450000", "taken remote"}));
}

TEST(ConversationCache, MirroredEntriesAreMarkedCountedAndAged) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  cache.put("mine", entry("127.0.30.1:8000"), t0, limits());
  EXPECT_TRUE(cache.mirror("theirs", entry("127.0.30.2:8000"), t0 - 400s, t0, limits()));
  EXPECT_FALSE(cache.mirror("old", entry("127.0.30.2:8000"), t0 - 450s, t0, limits()));  // already expired
  auto st = cache.stats();
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.remote_entries, 1u);
  // Stored 400 s before t0 on the writer's clock: gone 50 s later.
  EXPECT_FALSE(cache.take("theirs", t0 + 51s, 450s).has_value());
  EXPECT_EQ(cache.stats().remote_entries, 0u);
  // A local put replaces a mirrored entry and is no longer remote.
  EXPECT_TRUE(cache.mirror("c", entry("127.0.30.2:8000"), t0, t0, limits()));
  cache.put("c", entry("127.0.30.3:8000"), t0, limits());
  st = cache.stats();
  EXPECT_EQ(st.remote_entries, 0u);
  auto got = cache.take("c", t0, 450s);
  ASSERT_TRUE(got.has_value());
  EXPECT_FALSE(got->remote);
  EXPECT_EQ(got->decode_key, "127.0.30.3:8000");
}

TEST(ConversationCache, MirroredEntriesObeyTheLimitsAndAResyncDropsVanishedOnes) {
  ConversationCache cache;
  const auto t0 = Clock::now();
  EXPECT_FALSE(cache.mirror("huge", entry("127.0.30.2:8000", std::string(2000, 'x')), t0, t0, limits(100, 1000)));
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(cache.mirror("r" + std::to_string(i), entry("127.0.30.2:8000"), t0, t0, limits(3)));
  }
  EXPECT_EQ(cache.stats().entries, 3u);
  EXPECT_EQ(cache.stats().remote_entries, 3u);
  cache.put("local", entry("127.0.30.1:8000"), t0, limits());
  EXPECT_EQ(cache.drop_remote_except({"r4"}), 2u);
  const auto st = cache.stats();
  EXPECT_EQ(st.entries, 2u);  // r4 and local
  EXPECT_EQ(st.remote_entries, 1u);
  EXPECT_TRUE(cache.take("local", t0, 450s).has_value());
  EXPECT_TRUE(cache.take("r4", t0, 450s).has_value());
}

}  // namespace
}  // namespace pdr::router::proxy
