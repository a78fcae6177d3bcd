// SessionMirror and SharedEntriesFeed without etcd: what a bind queues for the replicator, what a
// range or watch events do to the session table, and how the shared feed splits keys between
// the conversation mirror and this one.
#include "router/session_mirror.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "proto/etcd_session.h"
#include "router/conversation_mirror.h"

namespace pdr::router {
namespace {

using namespace std::chrono_literals;
using routing::SessionTable;
using WallClock = ConversationFeed::WallClock;

constexpr const char* kPrefix = "/pdr/";

int64_t unix_ms(WallClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

struct Fixture {
  Fixture() {
    auto t = std::make_shared<config::Topology>();
    t->session_affinity.enabled = true;
    t->session_affinity.idle_ttl = 60s;
    t->session_affinity.max_sessions = 100;
    topology.publish(std::move(t));
    table.set_replication(&mirror);
  }
  SessionTable::Limits limits() const { return {100, 60s}; }
  SessionTable table;
  SnapshotCell<config::Topology> topology;
  routing::SessionAffinityCounters counters;
  int wakes = 0;
  SessionMirror mirror{table, topology, kPrefix, "replica-a", counters, [this] { ++wakes; }};
};

proto::EtcdKeyValue kv(const std::string& id, const std::string& writer, int64_t expires_ms,
                       const std::string& decode = "127.0.42.2:1", int64_t revision = 10) {
  proto::EtcdKeyValue out;
  out.key = proto::etcd_session_key(kPrefix, "", id);
  out.value = proto::encode_etcd_session({writer, "", "127.0.42.1:1", decode, expires_ms});
  out.mod_revision = revision;
  return out;
}

TEST(SessionMirror, ABindIsQueuedAsAPutWithItsExpiry) {
  Fixture f;
  const auto before = unix_ms(WallClock::now());
  f.table.bind({"", "s1"}, "127.0.42.1:1", "127.0.42.2:1", SessionTable::Clock::now(), f.limits());
  EXPECT_EQ(f.wakes, 1);
  auto ops = f.mirror.pop(10);
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].key, proto::etcd_session_key(kPrefix, "", "s1"));
  EXPECT_FALSE(ops[0].is_delete);
  EXPECT_GE(ops[0].lease_seconds, 60);
  proto::EtcdSessionEntry e;
  ASSERT_TRUE(proto::parse_etcd_session(ops[0].value, &e).is_ok());
  EXPECT_EQ(e.writer, "replica-a");
  EXPECT_EQ(e.decode_key, "127.0.42.2:1");
  EXPECT_GE(e.expires_unix_ms, before + 60'000);
  // A binding that stays is shared again only after half its idle_ttl.
  const auto now = SessionTable::Clock::now();
  f.table.refresh({"", "s1"}, now + 10s, f.limits());
  EXPECT_TRUE(f.mirror.pop(10).empty());
  f.table.refresh({"", "s1"}, now + 31s, f.limits());
  EXPECT_EQ(f.mirror.pop(10).size(), 1u);
}

TEST(SessionMirror, AFullQueueDropsAndCounts) {
  Fixture f;
  for (size_t i = 0; i < SessionMirror::kMaxQueued + 5; ++i) {
    f.table.bind({"", "s" + std::to_string(i)}, "127.0.42.1:1", "127.0.42.2:1", SessionTable::Clock::now(),
                 SessionTable::Limits{100000, 60s});
  }
  EXPECT_EQ(f.counters.etcd_dropped.load(), 5u);
  EXPECT_EQ(f.mirror.drop_queued(), SessionMirror::kMaxQueued);
}

TEST(SessionMirror, MirrorsOtherWritersAndRefusesBadValues) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = SessionTable::Clock::now();
  const int64_t future = unix_ms(wall) + 30'000;
  proto::EtcdKeyValue mangled = kv("s3", "replica-b", future);
  mangled.value = "{";
  proto::EtcdKeyValue other_binding = kv("s4", "replica-b", future);
  other_binding.value = proto::encode_etcd_session({"replica-b", std::string(32, 'x'), "a:1", "b:1", future});
  f.mirror.resync({kv("s1", "replica-b", future), kv("s2", "replica-b", unix_ms(wall) - 1), mangled, other_binding},
                  wall, now);
  EXPECT_EQ(f.table.find({"", "s1"}, now, f.limits())->decode_key, "127.0.42.2:1");
  EXPECT_FALSE(f.table.find({"", "s2"}, now, f.limits()).has_value());  // expired
  EXPECT_FALSE(f.table.find({"", "s3"}, now, f.limits()).has_value());
  EXPECT_FALSE(f.table.find({"", "s4"}, now, f.limits()).has_value());
  EXPECT_EQ(f.counters.etcd_bad_values.load(), 2u);
  EXPECT_EQ(f.counters.etcd_mirrored.load(), 1u);
  EXPECT_TRUE(f.mirror.pop(10).empty());  // mirrored bindings are not handed back
  // The latest put wins; this replica's own put seen on the watch changes nothing.
  f.mirror.apply({{false, kv("s1", "replica-b", future, "127.0.42.3:1", 11)},
                  {false, kv("s1", "replica-a", future, "127.0.42.9:1", 12)},
                  {true, kv("s1", "replica-b", future)}},
                 wall, now);
  EXPECT_EQ(f.table.find({"", "s1"}, now, f.limits())->decode_key, "127.0.42.3:1");
}

TEST(SessionMirror, AnOlderPutOfAnotherWriterDoesNotReplaceTheLocalBinding) {
  Fixture f;
  const auto wall = WallClock::now();
  const auto now = SessionTable::Clock::now();
  const int64_t future = unix_ms(wall) + 30'000;
  f.table.bind({"", "s1"}, "127.0.42.1:1", "127.0.42.5:1", now, f.limits());
  const std::string key = proto::etcd_session_key(kPrefix, "", "s1");
  f.mirror.put_sent(key);
  f.mirror.apply({{false, kv("s1", "replica-b", future, "127.0.42.6:1", 20)}}, wall, now);  // while in flight
  EXPECT_EQ(f.table.find({"", "s1"}, now, f.limits())->decode_key, "127.0.42.5:1");
  f.mirror.put_answered(key, true, 25);
  f.mirror.apply({{false, kv("s1", "replica-b", future, "127.0.42.6:1", 21)}}, wall, now);  // older than ours
  EXPECT_EQ(f.table.find({"", "s1"}, now, f.limits())->decode_key, "127.0.42.5:1");
  f.mirror.apply({{false, kv("s1", "replica-b", future, "127.0.42.7:1", 30)}}, wall, now);  // newer
  EXPECT_EQ(f.table.find({"", "s1"}, now, f.limits())->decode_key, "127.0.42.7:1");
  EXPECT_EQ(f.counters.etcd_puts.load(), 1u);
}

// A feed that records what reaches it.
struct Recorder : ConversationFeed {
  std::vector<std::string> keys;
  std::vector<ConversationOp> queued;
  void close() override {}
  std::vector<ConversationOp> pop(size_t max) override {
    std::vector<ConversationOp> out;
    while (out.size() < max && !queued.empty()) {
      out.push_back(queued.front());
      queued.erase(queued.begin());
    }
    return out;
  }
  size_t drop_queued() override { return std::exchange(queued, {}).size(); }
  void resync(const std::vector<proto::EtcdKeyValue>& kvs, WallClock::time_point, Clock::time_point) override {
    for (const auto& kv : kvs) keys.push_back(kv.key);
  }
  void apply(const std::vector<proto::EtcdEvent>& events, WallClock::time_point, Clock::time_point) override {
    for (const auto& e : events) keys.push_back(e.kv.key);
  }
  void put_sent(const std::string& key) override { keys.push_back("sent " + key); }
  void put_answered(const std::string& key, bool, int64_t) override { keys.push_back("answered " + key); }
  void delete_sent(const std::string& key) override { keys.push_back("deleted " + key); }
};

TEST(SharedEntriesFeed, SplitsKeysAndTakesFromBothQueuesInTurn) {
  auto c = std::make_unique<Recorder>();
  auto s = std::make_unique<Recorder>();
  Recorder* conversations = c.get();
  Recorder* sessions = s.get();
  const std::string sp = proto::etcd_sessions_prefix(kPrefix);
  SharedEntriesFeed feed(std::move(c), std::move(s), sp);
  proto::EtcdKeyValue conv, sess;
  conv.key = "/pdr/conversations/anonymous/YQ";
  sess.key = sp + "anonymous/YQ";
  feed.resync({conv, sess}, WallClock::now(), ConversationFeed::Clock::now());
  feed.apply({{false, sess}, {true, conv}}, WallClock::now(), ConversationFeed::Clock::now());
  feed.put_sent(sess.key);
  feed.put_answered(conv.key, true, 1);
  EXPECT_EQ(conversations->keys, (std::vector<std::string>{conv.key, conv.key, "answered " + conv.key}));
  EXPECT_EQ(sessions->keys, (std::vector<std::string>{sess.key, sess.key, "sent " + sess.key}));
  for (int i = 0; i < 4; ++i) {
    conversations->queued.push_back({"c" + std::to_string(i)});
    sessions->queued.push_back({"s" + std::to_string(i)});
  }
  // A flood of one kind cannot starve the other: each pop takes from both.
  auto first = feed.pop(2), second = feed.pop(2);
  EXPECT_EQ(first.size(), 2u);
  EXPECT_NE(first[0].key[0], first[1].key[0]);
  EXPECT_NE(second[0].key[0], second[1].key[0]);
  EXPECT_EQ(feed.pop(10).size(), 4u);
  EXPECT_EQ(feed.drop_queued(), 0u);
}

}  // namespace
}  // namespace pdr::router
