// NodeClient against a real ZMQ ROUTER on loopback: what arrives on the wire in each format, the
// cadence, acks, pause/resume, goodbye, several endpoints, and a dead endpoint at shutdown.
#include "discovery/sidecar/node_client.h"

#include "tests/support/time_scale.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

namespace pdr::sidecar {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using proto::DiscoveryMessage;
using proto::RegistrationFormat;

// The router side: a ROUTER bound to an ephemeral loopback port.
class TestRouter {
 public:
  TestRouter() : socket_(context_, zmq::socket_type::router) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind("tcp://127.0.0.1:*");
    endpoint_ = socket_.get(zmq::sockopt::last_endpoint);
  }

  const std::string& endpoint() const { return endpoint_; }

  // Next multipart message, or nothing once `timeout` passes.
  std::optional<std::vector<std::string>> receive(std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) == 0) return std::nullopt;
    std::vector<std::string> frames;
    zmq::message_t frame;
    do {
      if (!socket_.recv(frame, zmq::recv_flags::none)) return std::nullopt;
      frames.push_back(frame.to_string());
    } while (frame.more());
    return frames;
  }

  // Next message decoded; fails the test on a wrong frame count or undecodable payload.
  std::optional<DiscoveryMessage> receive_decoded(std::chrono::milliseconds timeout,
                                                  std::string* identity = nullptr) {
    auto frames = receive(timeout);
    if (!frames) return std::nullopt;
    EXPECT_EQ(frames->size(), 2u) << "expected [identity, payload]";
    if (frames->size() != 2) return std::nullopt;
    if (identity != nullptr) *identity = (*frames)[0];
    DiscoveryMessage message;
    Status s = proto::decode_discovery_message(proto::as_bytes((*frames)[1]), {}, &message);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    if (!s.is_ok()) return std::nullopt;
    return message;
  }

  // Receives until `timeout` of silence; returns how many messages arrived.
  int drain(std::chrono::milliseconds silence) {
    int n = 0;
    while (receive(silence)) ++n;
    return n;
  }

  void reply(const std::string& identity, const std::string& payload) {
    socket_.send(zmq::buffer(identity), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(payload), zmq::send_flags::none);
  }

 private:
  zmq::context_t context_;
  zmq::socket_t socket_;
  std::string endpoint_;
};

proto::Registration moriio_registration(RegistrationFormat format) {
  proto::Registration r;
  r.format = format;
  r.role = proto::Role::kDecode;
  r.http_address = {"127.0.0.1", 8100};
  r.zmq_address = "host:127.0.0.1,handshake:6301,notify:61005";
  r.moriio_zmq = proto::MoriioZmqAddress{"127.0.0.1", 6301, 61005};
  r.dp_size = 2;
  r.tp_size = 4;
  r.transfer_mode = proto::TransferMode::kRead;
  r.connector = proto::Connector::kMoriio;
  return r;
}

proto::Registration p2p_registration() {
  proto::Registration r;
  r.format = RegistrationFormat::kP2pNccl;
  r.role = proto::Role::kPrefill;
  r.http_address = {"127.0.0.1", 8200};
  r.zmq_address = "127.0.0.1:21001";
  r.kv_address = proto::HostPort{"127.0.0.1", 21001};
  r.connector = proto::Connector::kP2pNccl;
  return r;
}

proto::Registration pdrouter_registration() {
  proto::Registration r = moriio_registration(RegistrationFormat::kPdrouter);
  r.schema_version = 1;
  r.model = "tiny-model";
  r.labels = {{"zone", "a"}};
  return r;
}

proto::Registration registration_for(RegistrationFormat format) {
  switch (format) {
    case RegistrationFormat::kP2pNccl: return p2p_registration();
    case RegistrationFormat::kPdrouter: return pdrouter_registration();
    default: return moriio_registration(format);
  }
}

NodeClientOptions options_for(const std::vector<std::string>& endpoints, proto::Registration r,
                              std::chrono::milliseconds interval) {
  NodeClientOptions options;
  options.router_endpoints = endpoints;
  options.registration = std::move(r);
  options.interval = interval;
  return options;
}

// For state the client thread updates (stats): checks `predicate` until it holds or 2 s pass
// (scaled by the build's slowdown).
template <typename Predicate>
bool eventually(Predicate predicate) {
  const auto deadline = Clock::now() + test::scaled(2s);
  while (Clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return predicate();
}

class NodeClientFormatTest : public ::testing::TestWithParam<RegistrationFormat> {};

TEST_P(NodeClientFormatTest, HeartbeatsArriveDecodedAtTheInterval) {
  TestRouter router;
  const proto::Registration sent = registration_for(GetParam());
  NodeClient client(options_for({router.endpoint()}, sent, 100ms));
  ASSERT_TRUE(client.start().is_ok());

  // Three 100 ms heartbeats within 1 s (scaled: a sanitizer build on a loaded machine is slower).
  const auto deadline = Clock::now() + test::scaled(1s);
  int received = 0;
  while (received < 3) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    ASSERT_GT(left.count(), 0) << "only " << received << " heartbeats within the deadline";
    std::string identity;
    auto message = router.receive_decoded(left, &identity);
    ASSERT_TRUE(message.has_value());
    ASSERT_EQ(message->kind, DiscoveryMessage::Kind::kRegistration);
    const proto::Registration& got = message->registration;
    EXPECT_EQ(got.format, sent.format);
    EXPECT_EQ(got.role, sent.role);
    EXPECT_EQ(got.http_address, sent.http_address);
    EXPECT_EQ(got.zmq_address, sent.zmq_address);
    if (GetParam() == RegistrationFormat::kP2pNccl) {
      EXPECT_EQ(identity, sent.zmq_address) << "P2P-NCCL nodes use zmq_address as identity";
    } else {
      EXPECT_EQ(got.dp_size, 2u);
      EXPECT_EQ(got.tp_size, 4u);
      EXPECT_EQ(got.transfer_mode, proto::TransferMode::kRead);
      EXPECT_EQ(got.moriio_zmq, sent.moriio_zmq);
    }
    if (GetParam() == RegistrationFormat::kMoriioLegacy) {
      EXPECT_EQ(got.legacy_index, std::to_string(received)) << "index counts pings";
    }
    if (GetParam() == RegistrationFormat::kPdrouter) {
      EXPECT_EQ(got.schema_version, 1u);
      EXPECT_EQ(got.model, "tiny-model");
      EXPECT_EQ(got.labels, sent.labels);
      EXPECT_FALSE(got.instance_id.empty()) << "defaults to hostname:pid";
      EXPECT_GT(got.epoch, 0u) << "defaults to the unix time in ms";
      EXPECT_EQ(got.instance_id, client.effective_registration().instance_id);
      EXPECT_EQ(got.epoch, client.effective_registration().epoch);
    }
    ++received;
  }
  client.stop(false);
  EXPECT_GE(client.stats().heartbeats_sent, 3u);
  EXPECT_EQ(client.stats().send_failures, 0u);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, NodeClientFormatTest,
                         ::testing::Values(RegistrationFormat::kMoriio,
                                           RegistrationFormat::kMoriioLegacy,
                                           RegistrationFormat::kP2pNccl,
                                           RegistrationFormat::kPdrouter),
                         [](const auto& info) {
                           std::string name(proto::to_string(info.param));
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

TEST(NodeClientTest, FirstHeartbeatIsImmediate) {
  TestRouter router;
  NodeClient client(options_for({router.endpoint()}, pdrouter_registration(), 10s));
  ASSERT_TRUE(client.start().is_ok());
  EXPECT_TRUE(router.receive(1s).has_value()) << "first heartbeat must not wait one interval";
}

TEST(NodeClientTest, PdrouterAcksAreRecorded) {
  TestRouter router;
  NodeClient client(options_for({router.endpoint()}, pdrouter_registration(), 50ms));
  ASSERT_TRUE(client.start().is_ok());
  auto frames = router.receive(1s);
  ASSERT_TRUE(frames.has_value());

  proto::Ack ack;
  ack.ttl_ms = 9000;
  ack.registry_version = 7;
  router.reply((*frames)[0], proto::encode_ack(ack));
  ASSERT_TRUE(eventually([&] { return client.stats().acks_received >= 1; }));
  auto recorded = client.last_ack(0);
  ASSERT_TRUE(recorded.has_value());
  EXPECT_TRUE(recorded->ok);
  EXPECT_EQ(recorded->ttl_ms, 9000u);
  EXPECT_EQ(recorded->registry_version, 7u);
  EXPECT_EQ(client.stats().acks_rejected, 0u);

  proto::Ack rejection;
  rejection.ok = false;
  rejection.reason = "unauthenticated: bad token";
  router.reply((*frames)[0], proto::encode_ack(rejection));
  ASSERT_TRUE(eventually([&] { return client.stats().acks_rejected >= 1; }));
  EXPECT_EQ(client.stats().last_ack_reason, "unauthenticated: bad token");
  EXPECT_FALSE(client.last_ack(0)->ok);
  EXPECT_FALSE(client.last_ack(1).has_value()) << "out of range index";
}

TEST(NodeClientTest, PauseStopsHeartbeats) {
  TestRouter router;
  NodeClient client(options_for({router.endpoint()}, pdrouter_registration(), 50ms));
  ASSERT_TRUE(client.start().is_ok());
  ASSERT_TRUE(router.receive(1s).has_value());

  client.pause();
  router.drain(100ms);  // a heartbeat may have been in flight when pause() was posted
  EXPECT_FALSE(router.receive(300ms).has_value()) << "heartbeat while paused";
  client.resume();
  EXPECT_TRUE(router.receive(1s).has_value());
}

TEST(NodeClientTest, ResumeSendsAtOnce) {
  TestRouter router;
  NodeClient client(options_for({router.endpoint()}, pdrouter_registration(), 10s));
  ASSERT_TRUE(client.start().is_ok());
  ASSERT_TRUE(router.receive(1s).has_value());
  client.pause();
  client.resume();
  EXPECT_TRUE(router.receive(1s).has_value()) << "resume() should not wait for the 10 s interval";
}

TEST(NodeClientTest, SetDrainingSendsAtOnceAndUpdateLoadRidesTheNextHeartbeat) {
  TestRouter router;
  NodeClient client(options_for({router.endpoint()}, pdrouter_registration(), 10s));
  ASSERT_TRUE(client.start().is_ok());
  ASSERT_TRUE(router.receive(1s).has_value());

  proto::NodeLoad load;
  load.present = true;
  load.running = 3;
  load.waiting = 4;
  load.free_kv_blocks = 500;
  client.update_load(load);
  client.set_draining(true);
  auto message = router.receive_decoded(1s);
  ASSERT_TRUE(message.has_value()) << "set_draining(true) should send at once";
  EXPECT_TRUE(message->registration.draining);
  EXPECT_TRUE(message->registration.load.present);
  EXPECT_EQ(message->registration.load.running, 3u);
  EXPECT_EQ(message->registration.load.waiting, 4u);
  EXPECT_EQ(message->registration.load.free_kv_blocks, 500u);
}

TEST(NodeClientTest, StopWithGoodbyeDeliversGoodbye) {
  TestRouter router;
  NodeClient client(options_for({router.endpoint()}, pdrouter_registration(), 50ms));
  ASSERT_TRUE(client.start().is_ok());
  ASSERT_TRUE(router.receive(1s).has_value());
  client.stop(true);
  EXPECT_FALSE(client.running());

  std::optional<DiscoveryMessage> message;
  do {
    message = router.receive_decoded(1s);
  } while (message && message->kind == DiscoveryMessage::Kind::kRegistration);
  ASSERT_TRUE(message.has_value()) << "no goodbye arrived";
  ASSERT_EQ(message->kind, DiscoveryMessage::Kind::kGoodbye);
  EXPECT_EQ(message->goodbye.http_address, client.effective_registration().http_address);
  EXPECT_EQ(message->goodbye.instance_id, client.effective_registration().instance_id);
  EXPECT_EQ(message->goodbye.epoch, client.effective_registration().epoch);
  EXPECT_EQ(client.stats().goodbyes_sent, 1u);
}

TEST(NodeClientTest, PlainDialectStopsWithoutGoodbye) {
  TestRouter router;
  NodeClient client(
      options_for({router.endpoint()}, moriio_registration(RegistrationFormat::kMoriio), 10s));
  ASSERT_TRUE(client.start().is_ok());
  ASSERT_TRUE(router.receive(1s).has_value());
  client.stop(true);
  EXPECT_EQ(client.stats().goodbyes_sent, 0u);
  EXPECT_FALSE(router.receive(200ms).has_value()) << "vLLM dialects have no goodbye";
}

TEST(NodeClientTest, EveryEndpointReceives) {
  TestRouter first;
  TestRouter second;
  NodeClient client(
      options_for({first.endpoint(), second.endpoint()}, pdrouter_registration(), 50ms));
  ASSERT_TRUE(client.start().is_ok());
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(first.receive_decoded(1s).has_value());
    EXPECT_TRUE(second.receive_decoded(1s).has_value());
  }
  client.stop(true);
  EXPECT_EQ(client.stats().goodbyes_sent, 2u);
}

std::string endpoint_with_nothing_listening() {
  TestRouter placeholder;  // bound then closed: its port is free again
  return placeholder.endpoint();
}

TEST(NodeClientTest, DeadEndpointDoesNotBlockStop) {
  for (bool goodbye : {false, true}) {
    TestRouter live;
    NodeClient client(options_for({endpoint_with_nothing_listening(), live.endpoint()},
                                  pdrouter_registration(), 20ms));
    ASSERT_TRUE(client.start().is_ok());
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(live.receive(1s).has_value()) << "a dead endpoint must not starve a live one";
    }
    const auto began = Clock::now();
    client.stop(goodbye);
    EXPECT_LT(Clock::now() - began, 2s) << "goodbye=" << goodbye;
  }
}

TEST(NodeClientTest, StartRejectsBadConfiguration) {
  NodeClient no_endpoints(options_for({}, pdrouter_registration(), 50ms));
  EXPECT_FALSE(no_endpoints.start().is_ok());

  NodeClient bad_endpoint(options_for({"not-an-endpoint"}, pdrouter_registration(), 50ms));
  Status s = bad_endpoint.start();
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.to_string();

  TestRouter router;
  NodeClient twice(options_for({router.endpoint()}, pdrouter_registration(), 50ms));
  ASSERT_TRUE(twice.start().is_ok());
  EXPECT_FALSE(twice.start().is_ok());
}

TEST(NodeClientTest, StopBeforeStartAndTwiceIsHarmless) {
  TestRouter router;
  NodeClient client(options_for({router.endpoint()}, pdrouter_registration(), 50ms));
  client.stop(true);
  ASSERT_TRUE(client.start().is_ok());
  client.stop(false);
  client.stop(true);
  EXPECT_FALSE(client.running());
}

TEST(NodeClientTest, PauseBeforeStartSuppressesTheFirstHeartbeat) {
  TestRouter router;
  NodeClient client(options_for({router.endpoint()}, pdrouter_registration(), 50ms));
  client.pause();
  ASSERT_TRUE(client.start().is_ok());
  EXPECT_FALSE(router.receive(200ms).has_value());
  client.resume();
  EXPECT_TRUE(router.receive(1s).has_value());
}

TEST(NodeClientDefaultsTest, ExplicitValuesAreKept) {
  proto::Registration r = pdrouter_registration();
  r.instance_id = "node-7";
  r.epoch = 42;
  proto::Registration filled = with_registration_defaults(r);
  EXPECT_EQ(filled.instance_id, "node-7");
  EXPECT_EQ(filled.epoch, 42u);

  proto::Registration plain = with_registration_defaults(p2p_registration());
  EXPECT_EQ(plain.schema_version, 0u);
  EXPECT_TRUE(plain.instance_id.empty());
  EXPECT_EQ(plain.epoch, 0u);

  proto::Registration unversioned = pdrouter_registration();
  unversioned.schema_version = 0;
  EXPECT_EQ(with_registration_defaults(unversioned).schema_version, 1u);
}

}  // namespace
}  // namespace pdr::sidecar
