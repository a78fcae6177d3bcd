// ConversationMirror without etcd: what it queues for the replicator's thread, and what a range
// or watch events from etcd do to the cache (proto/etcd_conversation.h's codec on both sides).
#include "router/conversation_mirror.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "proto/etcd_conversation.h"
#include "discovery/sources/etcd/registry_replicator.h"

namespace pdr::router {
namespace {

using namespace std::chrono_literals;
using routing::ConversationCache;
using WallClock = ConversationMirror::WallClock;

constexpr const char* kPrefix = "/pdr/";

struct Fixture {
  Fixture() {
    auto t = std::make_shared<config::Topology>();
    t->multi_turn.enabled = true;
    t->multi_turn.ttl = std::chrono::milliseconds(450'000);
    t->multi_turn.max_entries = 3;
    topology.publish(std::move(t));
    cache.set_replication(&mirror);
  }
  ConversationCache cache;
  SnapshotCell<config::Topology> topology;
  ReplicatorStatus status;
  int wakes = 0;
  ConversationMirror mirror{cache, topology, kPrefix, "replica-a", status, [this] { ++wakes; }};
};

int64_t unix_ms(WallClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

// A conversation of the anonymous client, or of `binding`.
ConversationCache::Key K(std::string_view id, std::string_view binding = {}) { return {binding, id}; }
std::string ckey(std::string_view id, std::string_view binding = {}) {
  return proto::etcd_conversation_key(kPrefix, binding, id);
}

proto::EtcdKeyValue kv(const std::string& id, const std::string& writer, int64_t expires_ms,
                       const std::string& decode = "127.0.40.1:8000", const std::string& binding = {}) {
  proto::EtcdConversationEntry e;
  e.writer = writer;
  e.binding = binding;
  e.decode_key = decode;
  e.decode_epoch = 9;
  e.expires_unix_ms = expires_ms;
  e.prefill_params = R"({"remote_block_ids":[1,2],"do_remote_decode":true})";
  proto::EtcdKeyValue out;
  out.key = ckey(id, binding);
  out.value = proto::encode_etcd_conversation(e);
  return out;
}

proto::EtcdEvent delete_event(const std::string& id, int64_t revision, const std::string& binding = {}) {
  proto::EtcdEvent e;
  e.is_delete = true;
  e.kv.key = ckey(id, binding);
  e.kv.mod_revision = revision;
  return e;
}

ConversationCache::Limits limits() {
  ConversationCache::Limits l;
  l.ttl = 450s;
  l.max_entries = 3;
  return l;
}

TEST(ConversationMirror, LocalPutsAndTakesBecomeEtcdOperations) {
  Fixture f;
  const auto wall_before = WallClock::now();
  f.cache.put(K("conv/1"), ConversationCache::Entry{"127.0.40.1:8000", 4, R"({"x":1})"}, ConversationCache::Clock::now(),
              limits());
  ASSERT_TRUE(f.cache.take(K("conv/1"), ConversationCache::Clock::now(), 450s).has_value());
  EXPECT_EQ(f.wakes, 2);
  auto ops = f.mirror.pop(10);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_FALSE(ops[0].is_delete);
  EXPECT_EQ(ops[0].key, ckey("conv/1"));
  EXPECT_EQ(ops[0].lease_seconds, 450);
  proto::EtcdConversationEntry e;
  ASSERT_TRUE(proto::parse_etcd_conversation(ops[0].value, &e).is_ok());
  EXPECT_EQ(e.writer, "replica-a");
  EXPECT_EQ(e.decode_key, "127.0.40.1:8000");
  EXPECT_EQ(e.decode_epoch, 4u);
  EXPECT_EQ(e.prefill_params, R"({"x":1})");
  EXPECT_GE(e.expires_unix_ms, unix_ms(wall_before) + 450'000);
  EXPECT_LE(e.expires_unix_ms, unix_ms(WallClock::now()) + 450'000);
  EXPECT_TRUE(ops[1].is_delete);
  EXPECT_EQ(ops[1].key, ops[0].key);
  EXPECT_TRUE(f.mirror.pop(10).empty());
}

// Bindings (router/routing/conversation_binding.h) are 32-byte digests.
const std::string kAlice = "alice-binding-32-bytes-long-xxxx";
const std::string kMallory = "mallory-binding-32-bytes-long-xx";

TEST(ConversationMirror, TheClientsBindingGoesIntoTheKeyAndTheValue) {
  Fixture f;
  f.cache.put(K("conv/1", kAlice), ConversationCache::Entry{"127.0.40.1:8000", 4, R"({"x":1})"},
              ConversationCache::Clock::now(), limits());
  ASSERT_TRUE(f.cache.take(K("conv/1", kAlice), ConversationCache::Clock::now(), 450s).has_value());
  auto ops = f.mirror.pop(10);
  ASSERT_EQ(ops.size(), 2u);
  EXPECT_EQ(ops[0].key, std::string(kPrefix) + "conversations/" + proto::conversation_binding_text(kAlice) + "/" +
                            proto::base64url_encode("conv/1"));
  EXPECT_EQ(ops[1].key, ops[0].key);
  proto::EtcdConversationEntry e;
  ASSERT_TRUE(proto::parse_etcd_conversation(ops[0].value, &e).is_ok());
  EXPECT_EQ(e.binding, kAlice);
}

TEST(ConversationMirror, EntriesOfTwoClientsWithOneIdStayApartOnEveryReplica) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  proto::EtcdKeyValue alice = kv("conv", "replica-b", unix_ms(wall) + 100'000, "127.0.40.1:8000", kAlice);
  proto::EtcdKeyValue mallory = kv("conv", "replica-b", unix_ms(wall) + 100'000, "127.0.40.2:8000", kMallory);
  f.mirror.resync({alice, mallory}, wall, now);
  EXPECT_EQ(f.cache.stats().entries, 2u);
  // Mallory's take deletes only her key; Alice's entry stays on this replica.
  f.mirror.apply({delete_event("conv", 10, kMallory)}, wall, now);
  EXPECT_EQ(f.cache.stats().entries, 1u);
  bool other = false;
  EXPECT_FALSE(f.cache.take(K("conv", kMallory), now, 450s, &other).has_value());
  EXPECT_TRUE(other);
  EXPECT_FALSE(f.cache.take(K("conv"), now, 450s).has_value());  // nor for an anonymous client
  auto got = f.cache.take(K("conv", kAlice), now, 450s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->decode_key, "127.0.40.1:8000");
}

TEST(ConversationMirror, EntriesWithoutABindingOrWithAnotherOneInTheirValueAreRejected) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  const int64_t expires = unix_ms(wall) + 100'000;
  // A replica from before bindings: <prefix>conversations/<id>, no "binding" in the value.
  proto::EtcdKeyValue old_format;
  old_format.key = std::string(kPrefix) + "conversations/" + proto::base64url_encode("conv");
  old_format.value = R"({"writer":"replica-old","decode":"127.0.40.1:8000","epoch":1,"expires_ms":)" +
                     std::to_string(expires) + R"(,"params":{"remote_block_ids":[1]}})";
  // The same value under a key of the new layout: still no binding in it.
  proto::EtcdKeyValue old_value = old_format;
  old_value.key = ckey("conv");
  // A value naming Alice under Mallory's key.
  proto::EtcdKeyValue moved = kv("conv", "replica-b", expires, "127.0.40.1:8000", kAlice);
  moved.key = ckey("conv", kMallory);
  f.mirror.resync({old_format, old_value, moved}, wall, now);
  proto::EtcdEvent old_delete;
  old_delete.is_delete = true;
  old_delete.kv.key = old_format.key;
  f.mirror.apply({proto::EtcdEvent{false, old_format}, old_delete}, wall, now);
  EXPECT_EQ(f.status.conversation_rejected.load(), 5u);
  EXPECT_EQ(f.cache.stats().entries, 0u);
}

TEST(ConversationMirror, TheQueueIsBoundedAndDroppingCountsFailures) {
  Fixture f;
  for (size_t i = 0; i < ConversationMirror::kMaxQueued + 5; ++i) {
    const std::string id = "c" + std::to_string(i);
    f.mirror.taken(K(id));
  }
  EXPECT_EQ(f.status.conversation_failures.load(), 5u);
  EXPECT_EQ(f.mirror.drop_queued(), ConversationMirror::kMaxQueued);
  EXPECT_EQ(f.status.conversation_failures.load(), 5u + ConversationMirror::kMaxQueued);
  f.mirror.close();
  f.mirror.taken(K("after-close"));
  EXPECT_TRUE(f.mirror.pop(10).empty());
}

TEST(ConversationMirror, AResyncMirrorsOtherWritersEntriesAsRemote) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  f.mirror.resync({kv("theirs", "replica-b", unix_ms(wall) + 100'000), kv("mine", "replica-a", unix_ms(wall) + 100'000)},
                  wall, now);
  EXPECT_EQ(f.status.conversation_mirrored.load(), 1u);  // of other writers
  auto st = f.cache.stats();
  EXPECT_EQ(st.entries, 2u);  // "mine" too: this replica id's, restored (see RestoresOwnEntries...)
  EXPECT_EQ(st.remote_entries, 2u);
  // 100 s left of its 450 s: gone 100 s from now, whatever the two replicas' clocks say.
  EXPECT_FALSE(f.cache.take(K("theirs"), now + 101s, 450s).has_value());
  f.mirror.resync({kv("theirs", "replica-b", unix_ms(wall) + 100'000)}, wall, now);
  auto got = f.cache.take(K("theirs"), now + 99s, 450s);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->remote);
  EXPECT_EQ(got->decode_key, "127.0.40.1:8000");
  EXPECT_EQ(got->decode_epoch, 9u);
  EXPECT_EQ(got->prefill_params, R"({"remote_block_ids":[1,2],"do_remote_decode":true})");
  // Taking a mirrored entry deletes its key too (the put of "theirs" was never ours to write).
  auto ops = f.mirror.pop(10);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_TRUE(ops[0].is_delete);
}

TEST(ConversationMirror, RestoresOwnEntriesAfterARestartWithTheSameReplicaId) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  // Stored here (this process) and in etcd: the local entry stays as it is.
  f.cache.put(K("kept"), ConversationCache::Entry{"127.0.40.2:8000", 1, R"({"here":1})"}, now, limits());
  (void)f.mirror.pop(10);
  proto::EtcdKeyValue restored = kv("restored", "replica-a", unix_ms(wall) + 100'000);
  restored.mod_revision = 50;
  f.mirror.resync({restored, kv("kept", "replica-a", unix_ms(wall) + 100'000)}, wall, now);
  auto st = f.cache.stats();
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.remote_entries, 1u);  // "restored": etcd holds it
  EXPECT_EQ(f.status.conversation_mirrored.load(), 0u);
  // A late delete of an older take does not remove it; its expiry maps like a mirrored one.
  f.mirror.apply({delete_event("restored", 40)}, wall, now);
  EXPECT_FALSE(f.cache.take(K("restored"), now + 101s, 450s).has_value());
  f.mirror.resync({restored}, wall, now);
  auto got = f.cache.take(K("restored"), now + 99s, 450s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->decode_key, "127.0.40.1:8000");
  got = f.cache.take(K("kept"), now, 450s);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->prefill_params, R"({"here":1})");
  EXPECT_FALSE(got->remote);
  // Its own put seen on the watch is not restored (taken here meanwhile: stays taken).
  f.mirror.apply({proto::EtcdEvent{false, kv("kept", "replica-a", unix_ms(wall) + 100'000)}}, wall, now);
  EXPECT_EQ(f.cache.stats().entries, 0u);
}

TEST(ConversationMirror, AResyncDropsRemoteEntriesEtcdNoLongerHoldsButKeepsLocalOnes) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  f.mirror.resync({kv("r1", "replica-b", unix_ms(wall) + 100'000), kv("r2", "replica-b", unix_ms(wall) + 100'000)}, wall,
                  now);
  f.cache.put(K("local"), ConversationCache::Entry{"127.0.40.2:8000", 1, "{}"}, now, limits());
  f.mirror.resync({kv("r2", "replica-b", unix_ms(wall) + 100'000)}, wall, now);
  EXPECT_FALSE(f.cache.take(K("r1"), now, 450s).has_value());
  EXPECT_TRUE(f.cache.take(K("r2"), now, 450s).has_value());
  EXPECT_TRUE(f.cache.take(K("local"), now, 450s).has_value());
}

TEST(ConversationMirror, BadExpiredOrForeignValuesAreRejectedAndCounted) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  proto::EtcdKeyValue not_json = kv("a", "replica-b", unix_ms(wall) + 1000);
  not_json.value = "{not json";
  proto::EtcdKeyValue bad_key = kv("b", "replica-b", unix_ms(wall) + 1000);
  bad_key.key = std::string(kPrefix) + "conversations/***";
  proto::EtcdKeyValue huge = kv("c", "replica-b", unix_ms(wall) + 1000);
  huge.value = std::string(proto::kMaxConversationValueBytes + 1, ' ');
  proto::EtcdKeyValue foreign = kv("d", "replica-b", unix_ms(wall) + 1000);
  foreign.key = "/other/conversations/ZA";
  f.mirror.resync({not_json, bad_key, huge, foreign, kv("expired", "replica-b", unix_ms(wall) - 1)}, wall, now);
  EXPECT_EQ(f.status.conversation_rejected.load(), 5u);
  EXPECT_EQ(f.status.conversation_mirrored.load(), 0u);
  EXPECT_EQ(f.cache.stats().entries, 0u);
}

TEST(ConversationMirror, WatchEventsMirrorPutsAndADeleteRemovesTheEntryWhoeverWroteIt) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  f.cache.put(K("mine"), ConversationCache::Entry{"127.0.40.2:8000", 1, "{}"}, now, limits());
  (void)f.mirror.pop(10);
  proto::EtcdEvent put;
  put.kv = kv("theirs", "replica-b", unix_ms(wall) + 100'000);
  proto::EtcdEvent del_mine;
  del_mine.is_delete = true;
  del_mine.kv.key = ckey("mine");  // taken on another replica
  proto::EtcdEvent del_bad;
  del_bad.is_delete = true;
  del_bad.kv.key = std::string(kPrefix) + "conversations/!";
  f.mirror.apply({put, del_mine, del_bad}, wall, now);
  EXPECT_EQ(f.status.conversation_rejected.load(), 1u);
  EXPECT_FALSE(f.cache.take(K("mine"), now, 450s).has_value());
  EXPECT_TRUE(f.cache.take(K("theirs"), now, 450s).has_value());
  // Neither the mirrored put nor the remote delete is written back.
  auto ops = f.mirror.pop(10);
  ASSERT_EQ(ops.size(), 1u);  // the take of "theirs"
  EXPECT_TRUE(ops[0].is_delete);
  EXPECT_EQ(ops[0].key, ckey("theirs"));
}

TEST(ConversationMirror, ALateDeleteOfAnotherReplicasTakeKeepsTheNewerLocalEntry) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  const std::string key = ckey("x");
  // This replica stored x; etcd applied the put at revision 50.
  f.cache.put(K("x"), ConversationCache::Entry{"127.0.40.2:8000", 1, "{}"}, now, limits());
  (void)f.mirror.pop(10);
  f.mirror.put_sent(key);
  f.mirror.put_answered(key, true, 50);
  // Another replica's take deleted the previous entry at 40; the event arrives now: ignored.
  f.mirror.apply({delete_event("x", 40)}, wall, now);
  EXPECT_EQ(f.cache.stats().entries, 1u);
  EXPECT_EQ(f.status.conversation_stale.load(), 1u);
  // A take of this very entry (after 50) removes it.
  f.mirror.apply({delete_event("x", 60)}, wall, now);
  EXPECT_EQ(f.cache.stats().entries, 0u);
}

TEST(ConversationMirror, ALatePutOfAnotherWriterKeepsTheNewerLocalEntry) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  const std::string key = ckey("x");
  f.cache.put(K("x"), ConversationCache::Entry{"127.0.40.2:8000", 1, "{}"}, now, limits());
  f.mirror.put_sent(key);
  f.mirror.put_answered(key, true, 50);
  proto::EtcdEvent older;
  older.kv = kv("x", "replica-b", unix_ms(wall) + 100'000);
  older.kv.mod_revision = 45;
  f.mirror.apply({older}, wall, now);
  EXPECT_EQ(f.cache.stats().remote_entries, 0u);  // still this replica's entry
  EXPECT_EQ(f.status.conversation_stale.load(), 1u);
  EXPECT_EQ(f.status.conversation_mirrored.load(), 0u);
  proto::EtcdEvent newer = older;
  newer.kv.mod_revision = 55;
  f.mirror.apply({newer}, wall, now);
  EXPECT_EQ(f.cache.stats().remote_entries, 1u);  // replaced by the newer one
  EXPECT_EQ(f.cache.stats().entries, 1u);
}

TEST(ConversationMirror, ADeleteSeenWhileThePutIsInFlightIsDecidedByThePutsRevision) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  const std::string key = ckey("x");
  f.cache.put(K("x"), ConversationCache::Entry{"127.0.40.2:8000", 1, "{}"}, now, limits());
  f.mirror.put_sent(key);
  f.mirror.apply({delete_event("x", 40)}, wall, now);
  EXPECT_EQ(f.cache.stats().entries, 1u);  // deferred
  f.mirror.put_answered(key, true, 50);   // the put came after the delete: kept
  EXPECT_EQ(f.cache.stats().entries, 1u);
  EXPECT_EQ(f.status.conversation_stale.load(), 1u);

  f.mirror.put_sent(key);
  f.mirror.apply({delete_event("x", 70)}, wall, now);
  EXPECT_EQ(f.cache.stats().entries, 1u);
  f.mirror.put_answered(key, true, 60);   // the delete took this put's entry: gone
  EXPECT_EQ(f.cache.stats().entries, 0u);

  f.cache.put(K("y"), ConversationCache::Entry{"127.0.40.2:8000", 1, "{}"}, now, limits());
  const std::string key_y = ckey("y");
  f.mirror.put_sent(key_y);
  f.mirror.apply({delete_event("y", 80)}, wall, now);
  f.mirror.put_answered(key_y, false, 0);  // failed put: nothing newer in etcd, the delete applies
  EXPECT_EQ(f.cache.stats().entries, 0u);
}

TEST(ConversationMirror, ThisReplicasOwnTakeForgetsItsPutRevision) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  const std::string key = ckey("x");
  f.mirror.put_sent(key);
  f.mirror.put_answered(key, true, 50);
  f.mirror.delete_sent(key);
  // x stored again by another replica (mirrored), then taken there at 45 (before 50: only the
  // forgotten revision would have kept it).
  proto::EtcdEvent put;
  put.kv = kv("x", "replica-b", unix_ms(wall) + 100'000);
  f.mirror.apply({put, delete_event("x", 45)}, wall, now);
  EXPECT_EQ(f.cache.stats().entries, 0u);
}

TEST(ConversationMirror, MirroredEntriesAreBoundedByTheTopologysLimits) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = ConversationCache::Clock::now();
  std::vector<proto::EtcdKeyValue> kvs;
  for (int i = 0; i < 10; ++i) kvs.push_back(kv("c" + std::to_string(i), "replica-b", unix_ms(wall) + 100'000));
  f.mirror.resync(kvs, wall, now);
  EXPECT_EQ(f.cache.stats().entries, 3u);  // multi_turn.max_entries
}

}  // namespace
}  // namespace pdr::router
