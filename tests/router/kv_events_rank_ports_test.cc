// KvEventsSubscriber with a node that lists each DP rank's port (NodeSpec::kv_events_ports and
// kv_events_replay_ports, as `pdnode sim` does for port 0): every rank's publisher and replay
// socket sits on an ephemeral port of its own, nowhere near rank 0's port + r, and the subscriber
// finds each where the node said. The test plays the publishers with XPUB sockets, so it waits
// for each subscription instead of sleeping.
#include "router/cache/kv_events_subscriber.h"

#include <gtest/gtest.h>
#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <functional>
#include <thread>

#include "tests/support/time_scale.h"

namespace pdr::router::cache {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kNode = "127.0.0.1:8100";

std::chrono::microseconds deadline() { return test::scaled(10s); }

// [ts, [["BlockStored", [hash], nil, [tokens], 4]], 0]: one block, the positional encoding.
std::string stored_block(uint64_t hash) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> p(buf);
  p.pack_array(3);
  p.pack_double(1.0);
  p.pack_array(1);
  p.pack_array(5);
  p.pack(std::string("BlockStored"));
  p.pack(std::vector<uint64_t>{hash});
  p.pack_nil();
  p.pack(std::vector<uint32_t>{1, 2, 3, 4});
  p.pack_uint32(4);
  p.pack_uint32(0);
  return std::string(buf.data(), buf.size());
}

bool eventually(const std::function<bool()>& condition) {
  const auto until = Clock::now() + deadline();
  while (Clock::now() < until) {
    if (condition()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return condition();
}

zmq::socket_t bound_socket(zmq::context_t& ctx, zmq::socket_type type) {
  zmq::socket_t s(ctx, type);
  s.set(zmq::sockopt::linger, 0);
  s.bind("tcp://127.0.0.1:0");
  return s;
}

uint16_t port_of(zmq::socket_t& s) {
  const std::string endpoint = s.get(zmq::sockopt::last_endpoint);
  return static_cast<uint16_t>(std::stoi(endpoint.substr(endpoint.rfind(':') + 1)));
}

// Waits until `socket` has a message (a subscription on an XPUB, a request on a ROUTER) and
// returns its frames.
std::vector<zmq::message_t> next_message(zmq::socket_t& socket) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  std::vector<zmq::message_t> frames;
  if (zmq::poll(&item, 1, std::chrono::duration_cast<std::chrono::milliseconds>(deadline())) == 1) {
    (void)zmq::recv_multipart(socket, std::back_inserter(frames));
  }
  return frames;
}

void publish(zmq::socket_t& pub, uint64_t seq, const std::string& payload) {
  const std::string seq_bytes = proto::encode_kv_event_seq(seq);
  pub.send(zmq::message_t(), zmq::send_flags::sndmore);
  pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
  pub.send(zmq::buffer(payload), zmq::send_flags::none);
}

TEST(KvEventsSubscriberRankPorts, EachDpRankOnTheListedPort) {
  zmq::context_t ctx(1);
  // Ranks bound in reverse order so their ports are no arithmetic run from rank 0's.
  zmq::socket_t replay2 = bound_socket(ctx, zmq::socket_type::router);
  zmq::socket_t rank2 = bound_socket(ctx, zmq::socket_type::xpub);
  zmq::socket_t replay1 = bound_socket(ctx, zmq::socket_type::router);
  zmq::socket_t rank1 = bound_socket(ctx, zmq::socket_type::xpub);
  zmq::socket_t replay0 = bound_socket(ctx, zmq::socket_type::router);
  zmq::socket_t rank0 = bound_socket(ctx, zmq::socket_type::xpub);

  SnapshotCell<discovery::RegistrySnapshot> registry;
  auto inst = std::make_shared<discovery::Instance>();
  inst->key = kNode;
  inst->http_address = {"127.0.0.1", 8100};
  inst->dp_size = 3;
  inst->kv_events_endpoint = proto::HostPort{"127.0.0.1", port_of(rank0)};
  inst->kv_events_replay_endpoint = proto::HostPort{"127.0.0.1", port_of(replay0)};
  inst->kv_events_ports = {port_of(rank0), port_of(rank1), port_of(rank2)};
  inst->kv_events_replay_ports = {port_of(replay0), port_of(replay1), port_of(replay2)};
  auto snap = std::make_shared<discovery::RegistrySnapshot>();
  snap->instances.push_back(inst);
  registry.publish(snap);
  BlockIndex index;
  KvEventsSubscriber subscriber(registry, index);
  KvEventsSubscriberOptions options;
  options.registry_poll = 5ms;
  ASSERT_TRUE(subscriber.start(options).is_ok());

  for (zmq::socket_t* pub : {&rank0, &rank1, &rank2}) {
    ASSERT_FALSE(next_message(*pub).empty()) << "a rank's publisher got no subscription";
  }
  EXPECT_EQ(subscriber.node_stats().at(0).subscribed_ranks, 3u);
  publish(rank2, 0, stored_block(7));
  ASSERT_TRUE(eventually([&] { return index.node_stats(kNode).entries == 1; }));

  // A gap on rank 1 (seq 0, then 2): its replay request goes to rank 1's listed replay port.
  publish(rank1, 0, stored_block(8));
  ASSERT_TRUE(eventually([&] { return index.node_stats(kNode).entries == 2; }));
  publish(rank1, 2, stored_block(9));
  const std::vector<zmq::message_t> request = next_message(replay1);
  ASSERT_FALSE(request.empty()) << "no replay request on rank 1's listed replay port";
  uint64_t start = 0;
  ASSERT_TRUE(proto::decode_kv_event_seq(
      {static_cast<const std::byte*>(request.back().data()), request.back().size()}, &start));
  EXPECT_EQ(start, 1u);
  subscriber.stop();
}

// A registry change of a rank's listed port alone (the node restarted on other ephemeral ports,
// rank 0's the same) moves the subscription.
TEST(KvEventsSubscriberRankPorts, AListedPortChangeResubscribes) {
  zmq::context_t ctx(1);
  zmq::socket_t rank0 = bound_socket(ctx, zmq::socket_type::xpub);
  zmq::socket_t old_rank1 = bound_socket(ctx, zmq::socket_type::xpub);
  zmq::socket_t new_rank1 = bound_socket(ctx, zmq::socket_type::xpub);

  SnapshotCell<discovery::RegistrySnapshot> registry;
  auto publish_node = [&](uint16_t rank1_port) {
    auto inst = std::make_shared<discovery::Instance>();
    inst->key = kNode;
    inst->http_address = {"127.0.0.1", 8100};
    inst->dp_size = 2;
    inst->kv_events_endpoint = proto::HostPort{"127.0.0.1", port_of(rank0)};
    inst->kv_events_ports = {port_of(rank0), rank1_port};
    auto snap = std::make_shared<discovery::RegistrySnapshot>();
    snap->instances.push_back(inst);
    registry.publish(snap);
  };
  publish_node(port_of(old_rank1));
  BlockIndex index;
  KvEventsSubscriber subscriber(registry, index);
  KvEventsSubscriberOptions options;
  options.registry_poll = 5ms;
  ASSERT_TRUE(subscriber.start(options).is_ok());
  ASSERT_FALSE(next_message(old_rank1).empty());
  publish_node(port_of(new_rank1));
  ASSERT_FALSE(next_message(new_rank1).empty()) << "rank 1 not subscribed at its new port";
  publish(new_rank1, 0, stored_block(11));
  ASSERT_TRUE(eventually([&] { return index.node_stats(kNode).entries == 1; }));
  subscriber.stop();
}

}  // namespace
}  // namespace pdr::router::cache
