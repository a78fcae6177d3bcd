// KvEventsSubscriber against real ZMQ sockets on loopback: the test plays vLLM's publisher (an
// XPUB, so it can wait for the subscription instead of sleeping) and its replay ROUTER.
#include "router/cache/kv_events_subscriber.h"

#include <gtest/gtest.h>
#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <functional>
#include <numeric>
#include <thread>

namespace pdr::router::cache {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kBlock = 4;
constexpr auto kDeadline = 10s;
const std::string kNode = "127.0.0.1:8100";

std::vector<uint32_t> tokens(uint32_t first, uint32_t count) {
  std::vector<uint32_t> t(count);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// [ts, [["BlockStored", [hashes], parent|nil, [tokens], kBlock]], 0]: the positional encoding.
std::string stored_batch(const std::vector<uint64_t>& hashes, std::optional<uint64_t> parent,
                         const std::vector<uint32_t>& toks) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack_double(1.0);
  p.pack_array(1);
  p.pack_array(5);
  p.pack(std::string("BlockStored"));
  p.pack(hashes);
  if (parent) p.pack_uint64(*parent); else p.pack_nil();
  p.pack(toks);
  p.pack_uint32(kBlock);
  p.pack_uint32(0);
  return std::string(buf.data(), buf.size());
}

bool eventually(const std::function<bool()>& condition) {
  const auto deadline = Clock::now() + kDeadline;
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::yield();
  }
  return condition();
}

std::string bound(zmq::socket_t& s) { return s.get(zmq::sockopt::last_endpoint); }
uint16_t port_of(const std::string& endpoint) {
  return static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
}

class KvEventsSubscriberTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pub_ = zmq::socket_t(ctx_, zmq::socket_type::xpub);
    pub_.set(zmq::sockopt::linger, 0);
    pub_.bind("tcp://127.0.0.1:0");
    replay_ = zmq::socket_t(ctx_, zmq::socket_type::router);
    replay_.set(zmq::sockopt::linger, 0);
    replay_.bind("tcp://127.0.0.1:0");
  }
  void TearDown() override { subscriber_.stop(); }

  // Publishes a registry holding kNode with the test's publisher (and replay socket, if asked).
  void register_node(bool with_replay, uint64_t restarts = 0, bool with_endpoint = true) {
    auto inst = std::make_shared<discovery::Instance>();
    inst->key = kNode;
    inst->http_address = {"127.0.0.1", 8100};
    if (with_endpoint) inst->kv_events_endpoint = proto::HostPort{"127.0.0.1", port_of(bound(pub_))};
    if (with_replay) inst->kv_events_replay_endpoint = proto::HostPort{"127.0.0.1", port_of(bound(replay_))};
    inst->restarts = restarts;
    auto snap = std::make_shared<discovery::RegistrySnapshot>();
    snap->version = ++version_;
    snap->instances.push_back(inst);
    registry_.publish(snap);
  }

  void start(KvEventsSubscriberOptions options = {}) {
    options.registry_poll = 5ms;
    ASSERT_TRUE(subscriber_.start(options).is_ok());
  }

  // Waits for the subscriber's subscription to reach the XPUB.
  void await_subscription() {
    zmq::pollitem_t item{pub_.handle(), 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(kDeadline)), 1);
    zmq::message_t sub;
    ASSERT_TRUE(pub_.recv(sub));
    ASSERT_EQ(sub.size(), 1u);  // "\x01" + empty topic
  }

  void publish(uint64_t seq, const std::string& payload) {
    const std::string seq_frame = proto::encode_kv_event_seq(seq);
    pub_.send(zmq::message_t(), zmq::send_flags::sndmore);
    pub_.send(zmq::buffer(seq_frame), zmq::send_flags::sndmore);
    pub_.send(zmq::buffer(payload), zmq::send_flags::none);
  }

  // One answer of the replay ROUTER, as vLLM's: [id, "", seq, payload].
  void reply_replay(const std::string& id, uint64_t seq, const std::string& payload) {
    const std::string seq_frame = proto::encode_kv_event_seq(seq);
    replay_.send(zmq::buffer(id), zmq::send_flags::sndmore);
    replay_.send(zmq::message_t(), zmq::send_flags::sndmore);
    replay_.send(zmq::buffer(seq_frame), zmq::send_flags::sndmore);
    replay_.send(zmq::buffer(payload), zmq::send_flags::none);
  }

  uint32_t matched(const std::vector<uint32_t>& request) const {
    for (const PrefixMatch& m : index_.longest_prefix(request)) {
      if (m.node == kNode) return m.matched_blocks;
    }
    return 0;
  }

  KvEventsNodeStats node() const {
    auto all = subscriber_.node_stats();
    return all.empty() ? KvEventsNodeStats{} : all[0];
  }

  zmq::context_t ctx_{1};
  zmq::socket_t pub_;
  zmq::socket_t replay_;
  SnapshotCell<discovery::RegistrySnapshot> registry_;
  uint64_t version_ = 0;
  BlockIndex index_;
  KvEventsSubscriber subscriber_{registry_, index_};
};

TEST_F(KvEventsSubscriberTest, EventsFlowIntoTheIndex) {
  register_node(false);
  start();
  await_subscription();
  publish(7, stored_batch({101, 102}, std::nullopt, tokens(0, 8)));  // first seq: accepted as is
  publish(8, stored_batch({103}, 102, tokens(8, 4)));
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 12)) == 3; }));
  // The subscriber counts a batch just after applying it to the index: wait for the count too.
  ASSERT_TRUE(eventually([&] { return node().batches >= 2u; }));
  const KvEventsNodeStats s = node();
  EXPECT_EQ(s.node, kNode);
  EXPECT_EQ(s.endpoint, bound(pub_));
  EXPECT_EQ(s.subscribed_ranks, 1u);
  EXPECT_EQ(s.ranks_seen, 1u);
  EXPECT_EQ(s.batches, 2u);
  EXPECT_EQ(s.events, 2u);
  EXPECT_EQ(s.gaps, 0u);
  EXPECT_EQ(s.blocks_indexed, 3u);

  // Bad input is counted, never fatal: two frames, a 7-byte seq, an undecodable payload.
  pub_.send(zmq::message_t(), zmq::send_flags::sndmore);
  pub_.send(zmq::buffer(std::string("x")), zmq::send_flags::none);
  pub_.send(zmq::message_t(), zmq::send_flags::sndmore);
  pub_.send(zmq::buffer(std::string(7, '\0')), zmq::send_flags::sndmore);
  pub_.send(zmq::buffer(std::string("p")), zmq::send_flags::none);
  ASSERT_TRUE(eventually([&] { return node().bad_messages == 2; }));
  publish(9, "\xc1");  // never-used msgpack byte
  ASSERT_TRUE(eventually([&] { return node().decode_errors == 1; }));
  EXPECT_EQ(matched(tokens(0, 12)), 0u) << "a batch that does not decode drops the node's entries";
  EXPECT_EQ(subscriber_.totals().decode_errors, 1u);
}

TEST_F(KvEventsSubscriberTest, GapWithoutReplayDropsTheNodesEntries) {
  register_node(false);
  start();
  await_subscription();
  publish(0, stored_batch({101, 102}, std::nullopt, tokens(0, 8)));
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 8)) == 2; }));
  publish(2, stored_batch({201}, std::nullopt, tokens(100, 4)));  // seq 1 never came
  ASSERT_TRUE(eventually([&] { return node().gaps == 1; }));
  EXPECT_EQ(matched(tokens(0, 8)), 0u);
  EXPECT_TRUE(eventually([&] { return matched(tokens(100, 4)) == 1; })) << "seq 2 itself applied";
  // Seq going backwards: the publisher restarted.
  publish(0, stored_batch({301}, std::nullopt, tokens(200, 4)));
  ASSERT_TRUE(eventually([&] { return node().publisher_restarts == 1; }));
  EXPECT_EQ(matched(tokens(100, 4)), 0u);
  EXPECT_TRUE(eventually([&] { return matched(tokens(200, 4)) == 1; }));
}

TEST_F(KvEventsSubscriberTest, GapWithReplayIsFilled) {
  register_node(true);
  start();
  await_subscription();
  publish(0, stored_batch({101}, std::nullopt, tokens(0, 4)));
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 12)) == 1; }));
  publish(3, stored_batch({104}, 103, tokens(12, 4)));  // 1 and 2 missed

  // Serve the replay request as vLLM's ROUTER does: [id, "", start] -> [id, "", seq, payload]...
  zmq::pollitem_t item{replay_.handle(), 0, ZMQ_POLLIN, 0};
  ASSERT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(kDeadline)), 1);
  std::vector<zmq::message_t> request;
  ASSERT_TRUE(zmq::recv_multipart(replay_, std::back_inserter(request)));
  ASSERT_EQ(request.size(), 3u);
  EXPECT_EQ(request[1].size(), 0u);
  uint64_t start_seq = 0;
  ASSERT_TRUE(proto::decode_kv_event_seq(
      {static_cast<const std::byte*>(request[2].data()), request[2].size()}, &start_seq));
  EXPECT_EQ(start_seq, 1u);
  const std::string id = request[0].to_string();
  auto reply = [&](uint64_t seq, const std::string& payload) { reply_replay(id, seq, payload); };
  reply(1, stored_batch({102}, 101, tokens(4, 4)));
  reply(2, stored_batch({103}, 102, tokens(8, 4)));
  reply(3, stored_batch({104}, 103, tokens(12, 4)));  // also live: ignored here
  reply(proto::kKvReplayEnd, "");

  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 16)) == 4; }));
  // The subscriber counts a batch just after applying it to the index: wait for the count too.
  ASSERT_TRUE(eventually([&] { return node().batches >= 4u; }));
  const KvEventsNodeStats s = node();
  EXPECT_EQ(s.replays, 1u);
  EXPECT_EQ(s.gaps, 0u);
  EXPECT_EQ(s.batches, 4u);
  EXPECT_EQ(s.replay_endpoint, bound(replay_));
}

// A replay in flight holds only its own rank: another node's events are indexed meanwhile, and
// the rank's own live batches (the one that revealed the gap and those queued behind it) are
// applied after the replayed ones, in order. Before, the replay blocked the whole subscriber
// thread until it ended (up to replay_timeout).
TEST_F(KvEventsSubscriberTest, AReplayInFlightHoldsOnlyItsRank) {
  zmq::socket_t pub_b(ctx_, zmq::socket_type::xpub);
  pub_b.set(zmq::sockopt::linger, 0);
  pub_b.bind("tcp://127.0.0.1:0");
  const std::string node_b = "127.0.0.1:8200";
  auto inst_a = std::make_shared<discovery::Instance>();
  inst_a->key = kNode;
  inst_a->http_address = {"127.0.0.1", 8100};
  inst_a->kv_events_endpoint = proto::HostPort{"127.0.0.1", port_of(bound(pub_))};
  inst_a->kv_events_replay_endpoint = proto::HostPort{"127.0.0.1", port_of(bound(replay_))};
  auto inst_b = std::make_shared<discovery::Instance>();
  inst_b->key = node_b;
  inst_b->http_address = {"127.0.0.1", 8200};
  inst_b->kv_events_endpoint = proto::HostPort{"127.0.0.1", port_of(bound(pub_b))};
  auto snap = std::make_shared<discovery::RegistrySnapshot>();
  snap->version = ++version_;
  snap->instances = {inst_a, inst_b};
  registry_.publish(snap);
  KvEventsSubscriberOptions options;
  options.replay_timeout = 3 * kDeadline;  // never the end of this replay: the test answers it
  start(options);
  await_subscription();
  {
    zmq::pollitem_t item{pub_b.handle(), 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(kDeadline)), 1);
    zmq::message_t sub;
    ASSERT_TRUE(pub_b.recv(sub));
  }
  publish(0, stored_batch({101}, std::nullopt, tokens(0, 4)));
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 20)) == 1; }));
  publish(3, stored_batch({104}, 103, tokens(12, 4)));  // 1 and 2 missed: a replay starts
  zmq::pollitem_t item{replay_.handle(), 0, ZMQ_POLLIN, 0};
  ASSERT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(kDeadline)), 1);
  std::vector<zmq::message_t> request;
  ASSERT_TRUE(zmq::recv_multipart(replay_, std::back_inserter(request)));
  ASSERT_EQ(request.size(), 3u);
  publish(4, stored_batch({105}, 104, tokens(16, 4)));  // queued behind the replay

  // Node B is served while A's replay is unanswered.
  const std::string seq0 = proto::encode_kv_event_seq(0);
  const std::string b_batch = stored_batch({201}, std::nullopt, tokens(100, 4));
  pub_b.send(zmq::message_t(), zmq::send_flags::sndmore);
  pub_b.send(zmq::buffer(seq0), zmq::send_flags::sndmore);
  pub_b.send(zmq::buffer(b_batch), zmq::send_flags::none);
  auto b_holds = [&] {
    for (const PrefixMatch& m : index_.longest_prefix(tokens(100, 4))) {
      if (m.node == node_b) return true;
    }
    return false;
  };
  ASSERT_TRUE(eventually(b_holds)) << "node B's batch waited for node A's replay";
  KvEventsNodeStats a;
  for (const KvEventsNodeStats& s : subscriber_.node_stats()) {
    if (s.node == kNode) a = s;
  }
  EXPECT_EQ(a.replays + a.replay_failures + a.gaps, 0u) << "A's replay is still in flight";
  EXPECT_EQ(matched(tokens(0, 20)), 1u) << "A's live batches wait for the replayed ones";

  const std::string id = request[0].to_string();
  auto reply = [&](uint64_t seq, const std::string& payload) { reply_replay(id, seq, payload); };
  reply(1, stored_batch({102}, 101, tokens(4, 4)));
  reply(2, stored_batch({103}, 102, tokens(8, 4)));
  reply(proto::kKvReplayEnd, "");
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 20)) == 5; }));
  ASSERT_TRUE(eventually([&] {
    for (const KvEventsNodeStats& s : subscriber_.node_stats()) {
      if (s.node == kNode) return s.batches >= 5u;
    }
    return false;
  }));
  for (const KvEventsNodeStats& s : subscriber_.node_stats()) {
    if (s.node != kNode) continue;
    EXPECT_EQ(s.replays, 1u);
    EXPECT_EQ(s.gaps, 0u);
    EXPECT_EQ(s.batches, 5u);
  }
}

TEST_F(KvEventsSubscriberTest, ReplayThatNeverAnswersFallsBackToDropping) {
  register_node(true);
  KvEventsSubscriberOptions options;
  options.replay_timeout = 200ms;  // the ROUTER never answers: this deadline ends the wait
  start(options);
  await_subscription();
  publish(0, stored_batch({101}, std::nullopt, tokens(0, 4)));
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 4)) == 1; }));
  publish(5, stored_batch({201}, std::nullopt, tokens(100, 4)));
  ASSERT_TRUE(eventually([&] { return node().gaps == 1; }));
  const KvEventsNodeStats s = node();
  EXPECT_EQ(s.replay_failures, 1u);
  EXPECT_EQ(s.replays, 0u);
  EXPECT_EQ(matched(tokens(0, 4)), 0u);
  EXPECT_TRUE(eventually([&] { return matched(tokens(100, 4)) == 1; }));
}

TEST_F(KvEventsSubscriberTest, DefaultPortOnTheNodesHost) {
  register_node(false, 0, /*with_endpoint=*/false);
  KvEventsSubscriberOptions options;
  options.default_port = port_of(bound(pub_));
  start(options);
  await_subscription();
  EXPECT_EQ(node().endpoint, bound(pub_)) << "tcp://<HTTP host>:default_port";
  publish(0, stored_batch({101}, std::nullopt, tokens(0, 4)));
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 4)) == 1; }));
}

TEST_F(KvEventsSubscriberTest, NoEndpointAndNoDefaultMeansNoSubscription) {
  register_node(false, 0, /*with_endpoint=*/false);
  start();
  // An absence can only be checked over a window: 20 registry polls with no subscription.
  zmq::pollitem_t item{pub_.handle(), 0, ZMQ_POLLIN, 0};
  EXPECT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(100)), 0);
  EXPECT_TRUE(subscriber_.node_stats().empty());
}

TEST_F(KvEventsSubscriberTest, NodeRestartAndRemovalDropEntries) {
  register_node(false);
  start();
  await_subscription();
  publish(0, stored_batch({101, 102}, std::nullopt, tokens(0, 8)));
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 8)) == 2; }));

  register_node(false, /*restarts=*/1);  // a new epoch of the same node
  ASSERT_TRUE(eventually([&] { return node().node_restarts == 1; }));
  EXPECT_EQ(matched(tokens(0, 8)), 0u);
  publish(0, stored_batch({101}, std::nullopt, tokens(0, 4)));  // seq from 0 again: no restart count
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 8)) == 1; }));
  EXPECT_EQ(node().publisher_restarts, 0u);

  registry_.publish(std::make_shared<discovery::RegistrySnapshot>());  // node gone
  ASSERT_TRUE(eventually([&] { return subscriber_.node_stats().empty(); }));
  EXPECT_EQ(matched(tokens(0, 8)), 0u);
  EXPECT_EQ(subscriber_.totals().node_restarts, 1u) << "totals outlive the node";
}

// DP rank r publishes on the base port + r: rank 1 of a dp_size-2 node is subscribed on its own.
TEST(KvEventsSubscriberRanks, EachDpRankOnItsOwnPort) {
  zmq::context_t ctx(1);
  zmq::socket_t rank0(ctx, zmq::socket_type::xpub), rank1(ctx, zmq::socket_type::xpub);
  rank0.set(zmq::sockopt::linger, 0);
  rank1.set(zmq::sockopt::linger, 0);
  uint16_t base = 0;
  for (int attempt = 0; attempt < 50 && base == 0; ++attempt) {  // two consecutive free ports
    rank0.bind("tcp://127.0.0.1:0");
    const uint16_t p = port_of(bound(rank0));
    try {
      rank1.bind("tcp://127.0.0.1:" + std::to_string(p + 1));
      base = p;
    } catch (const zmq::error_t&) {
      rank0.unbind(bound(rank0));
    }
  }
  ASSERT_NE(base, 0) << "no two consecutive free ports";

  SnapshotCell<discovery::RegistrySnapshot> registry;
  auto inst = std::make_shared<discovery::Instance>();
  inst->key = kNode;
  inst->http_address = {"127.0.0.1", 8100};
  inst->dp_size = 2;
  inst->kv_events_endpoint = proto::HostPort{"127.0.0.1", base};
  auto snap = std::make_shared<discovery::RegistrySnapshot>();
  snap->instances.push_back(inst);
  registry.publish(snap);
  BlockIndex index;
  KvEventsSubscriber subscriber(registry, index);
  KvEventsSubscriberOptions options;
  options.registry_poll = 5ms;
  ASSERT_TRUE(subscriber.start(options).is_ok());
  for (zmq::socket_t* s : {&rank0, &rank1}) {
    zmq::pollitem_t item{s->handle(), 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(kDeadline)), 1);
    zmq::message_t sub;
    ASSERT_TRUE(s->recv(sub));
  }
  const std::string payload = stored_batch({1, 2}, std::nullopt, tokens(0, 8));
  const std::string seq = proto::encode_kv_event_seq(0);
  rank1.send(zmq::message_t(), zmq::send_flags::sndmore);
  rank1.send(zmq::buffer(seq), zmq::send_flags::sndmore);
  rank1.send(zmq::buffer(payload), zmq::send_flags::none);
  ASSERT_TRUE(eventually([&] { return index.node_stats(kNode).entries == 2; }));
  const auto stats = subscriber.node_stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].subscribed_ranks, 2u);
  EXPECT_EQ(stats[0].ranks_seen, 1u);

  // A gap on rank 0 (seq 0, then 2) drops what rank 0 held, not rank 1's entries: each rank is
  // its own publisher and sequence.
  auto send = [](zmq::socket_t& s, uint64_t n, const std::string& body) {
    const std::string seq_bytes = proto::encode_kv_event_seq(n);
    s.send(zmq::message_t(), zmq::send_flags::sndmore);
    s.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
    s.send(zmq::buffer(body), zmq::send_flags::none);
  };
  send(rank0, 0, stored_batch({7}, std::nullopt, tokens(100, 4)));
  ASSERT_TRUE(eventually([&] { return index.node_stats(kNode).entries == 3; }));
  send(rank0, 2, stored_batch({8}, std::nullopt, tokens(200, 4)));  // seq 1 never came
  ASSERT_TRUE(eventually([&] {
    const auto s = subscriber.node_stats();
    return s.size() == 1 && s[0].gaps == 1 && index.node_stats(kNode).entries == 3;
  }));
  const auto held = [&](std::vector<uint32_t> toks) {
    const auto m = index.longest_prefix(toks);
    return m.empty() ? 0u : m[0].matched_blocks;
  };
  EXPECT_EQ(held(tokens(0, 8)), 2u) << "rank 1's entries survive rank 0's gap";
  EXPECT_EQ(held(tokens(100, 4)), 0u) << "rank 0's entry from before the gap is gone";
  EXPECT_EQ(held(tokens(200, 4)), 1u) << "the batch after the gap is applied";
  subscriber.stop();
}

}  // namespace
}  // namespace pdr::router::cache
