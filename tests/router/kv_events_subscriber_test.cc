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
#include <tuple>

#include "tests/support/time_scale.h"

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

// The two event encodings vLLM has shipped (proto/kv_events.h): positional arrays tagged first,
// and maps tagged by "type" (vLLM >= 0.26).
enum class Encoding { kArray, kMap };

// [ts, [BlockStored], 0] with BlockStored as ["BlockStored", [hashes], parent|nil, [tokens],
// kBlock, lora_id] or {"type": "BlockStored", "block_hashes": ..., ...}.
std::string stored_batch(const std::vector<uint64_t>& hashes, std::optional<uint64_t> parent,
                         const std::vector<uint32_t>& toks, Encoding encoding = Encoding::kArray) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack_double(1.0);
  p.pack_array(1);
  if (encoding == Encoding::kArray) {
    p.pack_array(6);
    p.pack(std::string("BlockStored"));
    p.pack(hashes);
    if (parent) p.pack_uint64(*parent); else p.pack_nil();
    p.pack(toks);
    p.pack_uint32(kBlock);
    p.pack_nil();
  } else {
    p.pack_map(7);
    p.pack(std::string("type")), p.pack(std::string("BlockStored"));
    p.pack(std::string("block_hashes")), p.pack(hashes);
    p.pack(std::string("parent_block_hash"));
    if (parent) p.pack_uint64(*parent); else p.pack_nil();
    p.pack(std::string("token_ids")), p.pack(toks);
    p.pack(std::string("block_size")), p.pack_uint32(kBlock);
    p.pack(std::string("lora_id")), p.pack_nil();
    p.pack(std::string("medium")), p.pack(std::string("GPU"));
  }
  p.pack_uint32(0);
  return std::string(buf.data(), buf.size());
}

// A batch of about `bytes` that costs the subscriber next to nothing: one event of a type the
// decoder does not know (skipped) carrying the bytes, so the bytes allowance binds however slowly
// the subscriber runs.
std::string padded_batch(size_t bytes) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack_double(1.0);
  p.pack_array(1);
  p.pack_array(2);
  p.pack(std::string("Padding"));
  p.pack_bin(static_cast<uint32_t>(bytes));
  p.pack_bin_body(std::string(bytes, 'x').data(), static_cast<uint32_t>(bytes));
  p.pack_uint32(0);
  return std::string(buf.data(), buf.size());
}

// A batch that costs the subscriber real work: `blocks` blocks (hashes from `first`), kBlock
// tokens each. Sent again and again it stores the same entries, so the index does not grow.
std::string heavy_batch(uint64_t first, uint32_t blocks) {
  std::vector<uint64_t> hashes(blocks);
  std::iota(hashes.begin(), hashes.end(), first);
  std::vector<uint32_t> toks(size_t{blocks} * kBlock);
  std::iota(toks.begin(), toks.end(), 1000000u);
  return stored_batch(hashes, std::nullopt, toks);
}

// Polls every millisecond: a tighter loop keeps the index's shared lock so busy that the
// subscriber's writes starve (glibc's rwlock prefers readers), which slows the flood tests a
// hundredfold under TSan.
bool eventually(const std::function<bool()>& condition) {
  const auto deadline = Clock::now() + test::scaled(kDeadline);
  while (Clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(1ms);
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
  void await_subscription() { await_subscription_on(pub_); }
  static void await_subscription_on(zmq::socket_t& xpub, const std::string& topic = "") {
    zmq::pollitem_t item{xpub.handle(), 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq::poll(&item, 1, wait_limit()), 1);
    zmq::message_t sub;
    ASSERT_TRUE(xpub.recv(sub));
    ASSERT_EQ(sub.to_string(), "\x01" + topic);  // subscribe + the topic prefix
  }
  static std::chrono::milliseconds wait_limit() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(test::scaled(kDeadline));
  }

  void publish(uint64_t seq, const std::string& payload) { publish_on(pub_, seq, payload); }
  static void publish_on(zmq::socket_t& xpub, uint64_t seq, const std::string& payload,
                         const std::string& topic = "") {
    const std::string seq_frame = proto::encode_kv_event_seq(seq);
    xpub.send(zmq::buffer(topic), zmq::send_flags::sndmore);
    xpub.send(zmq::buffer(seq_frame), zmq::send_flags::sndmore);
    xpub.send(zmq::buffer(payload), zmq::send_flags::none);
  }

  // An XPUB bound on an ephemeral loopback port that queues without bound (sndhwm 0), so a test
  // can queue a flood at once and what is measured is the subscriber's own bounds.
  zmq::socket_t make_publisher() {
    zmq::socket_t pub(ctx_, zmq::socket_type::xpub);
    pub.set(zmq::sockopt::linger, 0);
    pub.set(zmq::sockopt::sndhwm, 0);
    pub.bind("tcp://127.0.0.1:0");
    return pub;
  }

  static std::shared_ptr<discovery::Instance> instance(const std::string& key, uint16_t events_port,
                                                       uint32_t dp_size = 1) {
    auto inst = std::make_shared<discovery::Instance>();
    inst->key = key;
    inst->http_address = {"127.0.0.1", static_cast<uint16_t>(std::stoi(key.substr(key.rfind(':') + 1)))};
    inst->dp_size = dp_size;
    inst->kv_events_endpoint = proto::HostPort{"127.0.0.1", events_port};
    return inst;
  }
  void publish_registry(std::vector<std::shared_ptr<discovery::Instance>> instances) {
    auto snap = std::make_shared<discovery::RegistrySnapshot>();
    snap->version = ++version_;
    for (auto& inst : instances) snap->instances.push_back(std::move(inst));
    registry_.publish(snap);
  }

  KvEventsNodeStats stats_of(const std::string& key) const {
    for (const KvEventsNodeStats& s : subscriber_.node_stats()) {
      if (s.node == key) return s;
    }
    return {};
  }
  bool holds(const std::string& key, const std::vector<uint32_t>& request) const {
    for (const PrefixMatch& m : index_.longest_prefix(request)) {
      if (m.node == key) return true;
    }
    return false;
  }

  // One answer of the replay ROUTER: [id, "", seq, payload] (older vLLM, SGLang) or, with
  // `topic` (vLLM >= 0.26), [id, "", topic, seq, payload]; the end marker (kKvReplayEnd) has an
  // empty topic and payload.
  void reply_replay(const std::string& id, uint64_t seq, const std::string& payload,
                    std::optional<std::string> topic = std::nullopt) {
    const std::string seq_frame = proto::encode_kv_event_seq(seq);
    replay_.send(zmq::buffer(id), zmq::send_flags::sndmore);
    replay_.send(zmq::message_t(), zmq::send_flags::sndmore);
    if (topic) {
      replay_.send(zmq::buffer(seq == proto::kKvReplayEnd ? std::string() : *topic),
                   zmq::send_flags::sndmore);
    }
    replay_.send(zmq::buffer(seq_frame), zmq::send_flags::sndmore);
    replay_.send(zmq::buffer(payload), zmq::send_flags::none);
  }

  // Waits for the subscriber's replay request; returns the DEALER's id and the start seq.
  std::pair<std::string, uint64_t> await_replay_request() {
    zmq::pollitem_t item{replay_.handle(), 0, ZMQ_POLLIN, 0};
    EXPECT_EQ(zmq::poll(&item, 1, wait_limit()), 1);
    std::vector<zmq::message_t> request;
    EXPECT_TRUE(zmq::recv_multipart(replay_, std::back_inserter(request), zmq::recv_flags::dontwait));
    if (request.size() != 3) {
      ADD_FAILURE() << "a replay request has 3 frames, got " << request.size();
      return {};
    }
    EXPECT_EQ(request[1].size(), 0u);
    uint64_t start_seq = 0;
    EXPECT_TRUE(proto::decode_kv_event_seq(
        {static_cast<const std::byte*>(request[2].data()), request[2].size()}, &start_seq));
    return {request[0].to_string(), start_seq};
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

// A gap filled by a replay, in each layout of the replay socket's answers and each event
// encoding: with the topic frame, ["", topic, seq, payload] ending with ["", "", END, ""] (vLLM
// >= 0.26, vllm-project/vllm#45177), and without, ["", seq, payload] ending with ["", END, ""]
// (older vLLM, SGLang). Before, an answer with the topic frame counted as a bad message and the
// replay failed: the rank's entries were dropped (gaps 1, replays 0).
class KvEventsReplayLayoutTest
    : public KvEventsSubscriberTest,
      public ::testing::WithParamInterface<std::tuple<bool /*with topic*/, Encoding>> {};

TEST_P(KvEventsReplayLayoutTest, GapIsFilledByAReplay) {
  const auto [with_topic, encoding] = GetParam();
  const std::string topic = "kv@127.0.0.1@model";  // as llm-d names its topics
  register_node(true);
  KvEventsSubscriberOptions options;
  options.topic = topic;
  options.replay_timeout = 3 * kDeadline;  // never the end of this replay: the test answers it
  start(options);
  await_subscription_on(pub_, topic);
  publish_on(pub_, 0, stored_batch({101}, std::nullopt, tokens(0, 4), encoding), topic);
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 12)) == 1; }));
  publish_on(pub_, 3, stored_batch({104}, 103, tokens(12, 4), encoding), topic);  // 1, 2 missed

  const auto [id, start_seq] = await_replay_request();
  EXPECT_EQ(start_seq, 1u);
  const std::optional<std::string> answer_topic =
      with_topic ? std::optional<std::string>(topic) : std::nullopt;
  reply_replay(id, 1, stored_batch({102}, 101, tokens(4, 4), encoding), answer_topic);
  reply_replay(id, 2, stored_batch({103}, 102, tokens(8, 4), encoding), answer_topic);
  reply_replay(id, 3, stored_batch({104}, 103, tokens(12, 4), encoding), answer_topic);  // live too
  reply_replay(id, proto::kKvReplayEnd, "", answer_topic);

  // The subscriber counts a batch just after applying it to the index: wait for the count too.
  ASSERT_TRUE(eventually([&] { return node().replays + node().replay_failures >= 1; }));
  ASSERT_TRUE(eventually([&] { return node().batches >= 4u; }));
  const KvEventsNodeStats s = node();
  EXPECT_EQ(s.replays, 1u);
  EXPECT_EQ(s.replay_failures, 0u);
  EXPECT_EQ(s.gaps, 0u);
  EXPECT_EQ(s.bad_messages, 0u);
  EXPECT_EQ(s.batches, 4u);
  EXPECT_EQ(s.replay_endpoint, bound(replay_));
  EXPECT_EQ(matched(tokens(0, 16)), 4u);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, KvEventsReplayLayoutTest,
    ::testing::Combine(::testing::Bool(), ::testing::Values(Encoding::kArray, Encoding::kMap)),
    [](const ::testing::TestParamInfo<KvEventsReplayLayoutTest::ParamType>& info) {
      return std::string(std::get<0>(info.param) ? "WithTopic" : "WithoutTopic") +
             (std::get<1>(info.param) == Encoding::kMap ? "MapEvents" : "ArrayEvents");
    });

// A replay answer of neither layout ends the replay as a failure: the rank's entries dropped.
TEST_F(KvEventsSubscriberTest, AMalformedReplayAnswerFailsTheReplay) {
  register_node(true);
  KvEventsSubscriberOptions options;
  options.replay_timeout = 3 * kDeadline;
  start(options);
  await_subscription();
  publish(0, stored_batch({101}, std::nullopt, tokens(0, 4)));
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 4)) == 1; }));
  publish(2, stored_batch({201}, std::nullopt, tokens(100, 4)));
  const auto [id, start_seq] = await_replay_request();
  EXPECT_EQ(start_seq, 1u);
  replay_.send(zmq::buffer(id), zmq::send_flags::sndmore);  // [id, "", seq]: two frames
  replay_.send(zmq::message_t(), zmq::send_flags::sndmore);
  replay_.send(zmq::buffer(proto::encode_kv_event_seq(1)), zmq::send_flags::none);
  ASSERT_TRUE(eventually([&] { return node().gaps == 1; }));
  const KvEventsNodeStats s = node();
  EXPECT_EQ(s.bad_messages, 1u);
  EXPECT_EQ(s.replay_failures, 1u);
  EXPECT_EQ(s.replays, 0u);
  EXPECT_EQ(matched(tokens(0, 4)), 0u);
  EXPECT_TRUE(eventually([&] { return matched(tokens(100, 4)) == 1; })) << "the held batch applied";
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


// ---- Bounds: a node's publisher is untrusted input ----

// Blocks of the batches the flood tests send: enough work per batch (decode, hashing, index) that
// the subscriber is still applying one when the next has arrived. Under TSan, Debian's libzmq (not
// built with TSan) makes every byte it sends a suppressed race report, about 10 us a byte, so
// large batches would take seconds each just to leave the test's socket: the batches are smaller
// there (the order of service these tests check holds at any size; the ASan and release runs
// check it with large ones).
#if defined(__SANITIZE_THREAD__)
constexpr uint32_t kHeavyBlocks = 256;
constexpr uint64_t kStopFlood = 200;
#else
constexpr uint32_t kHeavyBlocks = 2048;
constexpr uint64_t kStopFlood = 1000;  // about 15 s of work for ASan
#endif

// The allowance out of the way, for the tests about time and fairness.
KvEventsSubscriberOptions unlimited() {
  KvEventsSubscriberOptions options;
  options.max_node_batches_per_sec = 1u << 30;
  options.max_node_bytes_per_sec = uint64_t{1} << 40;
  return options;
}

// Bytes: a node over its bytes-per-second allowance loses its entries with a counted gap, its
// batches are discarded undecoded, and once the allowance refills they are applied again. No
// batch larger than a second of the allowance is ever queued (the socket's message size limit).
TEST_F(KvEventsSubscriberTest, ANodeOverItsByteAllowanceLosesItsEntries) {
  register_node(false);
  KvEventsSubscriberOptions options;
  options.max_node_bytes_per_sec = 4 << 10;
  start(options);
  EXPECT_EQ(subscriber_.max_batch_bytes(), size_t{4} << 10);
  await_subscription();
  publish(0, stored_batch({101}, std::nullopt, tokens(0, 4)));
  ASSERT_TRUE(eventually([&] { return matched(tokens(0, 4)) == 1; }));
  const std::string big = padded_batch(1 << 10);
  for (uint64_t seq = 1; seq <= 32; ++seq) publish(seq, big);  // 8 times the allowance
  ASSERT_TRUE(eventually([&] { return node().rate_limited >= 16; }))
      << "rate_limited " << node().rate_limited << ", batches " << node().batches << ", decode errors "
      << node().decode_errors << ", bad messages " << node().bad_messages;
  EXPECT_EQ(matched(tokens(0, 4)), 0u) << "the rank's entries dropped";
  EXPECT_GE(node().gaps, 1u);
  EXPECT_EQ(node().decode_errors, 0u);
  EXPECT_EQ(subscriber_.totals().rate_limited, node().rate_limited);

  // The allowance refills over a second: a small batch now and then lands once it has.
  const auto deadline = Clock::now() + test::scaled(kDeadline);
  uint64_t seq = 33;
  while (matched(tokens(300, 4)) == 0 && Clock::now() < deadline) {
    publish(seq++, stored_batch({301}, std::nullopt, tokens(300, 4)));
    std::this_thread::sleep_for(20ms);  // pacing: the refill is a matter of time, not of an event
  }
  EXPECT_EQ(matched(tokens(300, 4)), 1u) << "the node's batches are applied again";
}

// Batches: a node publishing faster than its batches-per-second allowance has the excess
// discarded and counted.
TEST_F(KvEventsSubscriberTest, ANodeOverItsBatchAllowanceIsRateLimited) {
  register_node(false);
  KvEventsSubscriberOptions options;
  options.max_node_batches_per_sec = 5;
  start(options);
  await_subscription();
  for (uint64_t seq = 0; seq < 50; ++seq) {
    publish(seq, stored_batch({1000 + seq}, std::nullopt, tokens(1000 + 4 * static_cast<uint32_t>(seq), 4)));
  }
  ASSERT_TRUE(eventually([&] { return node().rate_limited + node().batches == 50; }));
  EXPECT_GE(node().rate_limited, 30u);
  EXPECT_LE(node().batches, 20u);
}

// Time: sockets are served round-robin, one bounded turn each. Node A has a queue of costly
// batches, node B one small batch sent just after them: B's batch is applied while most of A's
// still wait. Before, one wake drained up to 1,024 messages of A's socket first (B waited for
// all 40 of A's batches).
TEST_F(KvEventsSubscriberTest, ABusyNodeCannotStarveTheOthers) {
  zmq::socket_t flood = make_publisher();
  zmq::socket_t quiet = make_publisher();
  const std::string a = "127.0.0.1:8100", b = "127.0.0.1:8200";
  publish_registry({instance(a, port_of(bound(flood))), instance(b, port_of(bound(quiet)))});
  start(unlimited());
  await_subscription_on(flood);
  await_subscription_on(quiet);
  constexpr uint64_t kFlood = 40;
  const std::string heavy = heavy_batch(1, kHeavyBlocks);
  for (uint64_t seq = 0; seq < kFlood; ++seq) publish_on(flood, seq, heavy);
  publish_on(quiet, 0, stored_batch({900001}, std::nullopt, tokens(900000, 4)));
  ASSERT_TRUE(eventually([&] { return holds(b, tokens(900000, 4)); }));
  const uint64_t a_batches = stats_of(a).batches;
  EXPECT_LT(a_batches, kFlood / 2) << "node B's batch waited for node A's queue";
  ASSERT_TRUE(eventually([&] { return stats_of(a).batches == kFlood; })) << "A is served too";
}

// stop() returns once the batch being applied is done, not after the flood queued behind it.
// Before, it waited for up to 1,024 of the node's messages (here all kStopFlood of them).
TEST_F(KvEventsSubscriberTest, StopReturnsPromptlyWhileANodeFloods) {
  zmq::socket_t flood = make_publisher();
  publish_registry({instance(kNode, port_of(bound(flood)))});
  start(unlimited());
  await_subscription_on(flood);
  const std::string heavy = heavy_batch(1, kHeavyBlocks);
  for (uint64_t seq = 0; seq < kStopFlood; ++seq) publish_on(flood, seq, heavy);
  ASSERT_TRUE(eventually([&] { return node().batches >= 2; }));  // busy with the flood
  const auto begun = Clock::now();
  subscriber_.stop();
  const auto took = Clock::now() - begun;
  EXPECT_LT(took, test::scaled(500ms))
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_LT(subscriber_.totals().batches, kStopFlood / 2);
}

// Sockets: at most max_ranks_per_node ranks of one node are subscribed; the rest are counted.
TEST_F(KvEventsSubscriberTest, RanksBeyondTheCapPerNodeAreNotSubscribed) {
  publish_registry({instance(kNode, port_of(bound(pub_)), /*dp_size=*/5)});
  KvEventsSubscriberOptions options;
  options.max_ranks_per_node = 2;
  start(options);
  await_subscription();
  ASSERT_TRUE(eventually([&] { return node().subscribed_ranks == 2; }));
  const KvEventsNodeStats s = node();
  EXPECT_EQ(s.wanted_ranks, 5u);
  EXPECT_EQ(s.ranks_over_cap, 3u);
  const KvEventsNodeStats t = subscriber_.totals();
  EXPECT_EQ(t.ranks_over_cap, 3u);
  EXPECT_EQ(t.wanted_ranks, 5u);
  EXPECT_EQ(t.subscribed_ranks, 2u);
  publish(0, stored_batch({101}, std::nullopt, tokens(0, 4)));
  EXPECT_TRUE(eventually([&] { return matched(tokens(0, 4)) == 1; })) << "rank 0 is served";
}

// Sockets: with every subscription taken, a node is left unsubscribed, and it gets its socket
// once another node's are freed. Before, a node whose subscription failed (libzmq's 1,023
// sockets, or descriptors) was never tried again.
TEST_F(KvEventsSubscriberTest, ANodeLeftWithoutSocketsIsSubscribedOnceSocketsFreeUp) {
  zmq::socket_t hog_pub = make_publisher();
  const std::string hog = "127.0.0.1:8000";  // before kNode in key order: subscribed first
  publish_registry({instance(hog, port_of(bound(hog_pub)), /*dp_size=*/2),
                    instance(kNode, port_of(bound(pub_)))});
  KvEventsSubscriberOptions options;
  options.max_subscriptions = 2;
  options.resubscribe_interval = 20ms;
  start(options);
  EXPECT_EQ(subscriber_.max_subscriptions(), 2u);
  await_subscription_on(hog_pub);
  ASSERT_TRUE(eventually([&] {
    return stats_of(hog).subscribed_ranks == 2 && stats_of(kNode).wanted_ranks == 1;
  }));
  EXPECT_EQ(stats_of(kNode).subscribed_ranks, 0u);
  EXPECT_EQ(subscriber_.totals().subscribed_ranks, 2u);
  // An absence can only be checked over a window: a few retry intervals, no subscription.
  zmq::pollitem_t item{pub_.handle(), 0, ZMQ_POLLIN, 0};
  EXPECT_EQ(zmq::poll(&item, 1, 100ms), 0);

  publish_registry({instance(kNode, port_of(bound(pub_)))});  // the hog leaves
  await_subscription();
  ASSERT_TRUE(eventually([&] { return node().subscribed_ranks == 1; }));
  publish(0, stored_batch({101}, std::nullopt, tokens(0, 4)));
  EXPECT_TRUE(eventually([&] { return matched(tokens(0, 4)) == 1; }));
}

// The open-file limit caps subscriptions: a quarter of the descriptors, four per subscription.
TEST(KvEventsSubscriptionBudget, AQuarterOfTheOpenFileLimit) {
  EXPECT_EQ(subscription_budget(0, 1024), 1024u) << "no limit known";
  EXPECT_EQ(subscription_budget(uint64_t{1} << 62, 1024), 1024u) << "unlimited";
  EXPECT_EQ(subscription_budget(1024, 1024), 64u);
  EXPECT_EQ(subscription_budget(20000, 1024), 1024u);
  EXPECT_EQ(subscription_budget(1 << 20, 4096), 4096u);
  EXPECT_EQ(subscription_budget(8, 1024), 1u) << "never none";
  EXPECT_EQ(subscription_budget(1 << 20, 0), 1u);
}

}  // namespace
}  // namespace pdr::router::cache
