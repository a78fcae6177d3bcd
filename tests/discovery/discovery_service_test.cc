// DiscoveryService over a real ZMQ socket pair on loopback: every dialect through a C++ DEALER,
// acknowledgements, authentication, bad frames, and live topology changes.
#include "discovery/discovery_service.h"

#include <gtest/gtest.h>

#include <future>
#include <thread>
#include <zmq.hpp>

#include "discovery/sidecar/node_client.h"
#include "tests/support/time_scale.h"

namespace pdr::discovery {
namespace {

using namespace std::chrono_literals;

class DiscoveryServiceTest : public ::testing::Test {
 protected:
  void start(DiscoveryServiceOptions options = {}) {
    options.bind_endpoint = "tcp://127.0.0.1:0";
    ASSERT_TRUE(service_.start(options).is_ok());
    endpoint_ = service_.bound_endpoint();
    ASSERT_NE(endpoint_.find("tcp://127.0.0.1:"), std::string::npos) << endpoint_;
  }
  void TearDown() override { service_.stop(); }

  zmq::socket_t dealer() {
    zmq::socket_t s(ctx_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 1000);
    s.connect(endpoint_);
    return s;
  }
  zmq::socket_t dealer_with_routing_id(const std::string& id) {
    zmq::socket_t s(ctx_, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 1000);
    s.set(zmq::sockopt::routing_id, id);
    s.connect(endpoint_);
    return s;
  }
  void send(zmq::socket_t& s, const std::string& payload) {
    ASSERT_TRUE(s.send(zmq::buffer(payload), zmq::send_flags::none).has_value());
  }

  // Waits (bounded) until `pred(snapshot)` holds; returns how long it took.
  template <typename Pred>
  std::chrono::microseconds wait_until(Pred pred, std::chrono::milliseconds timeout = 5s) {
    const auto start = Clock::now();
    uint64_t seen = ~0ull;
    while (Clock::now() - start < timeout) {
      if (cell_.version() != seen) {
        seen = cell_.version();
        if (pred(*cell_.load())) {
          return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
        }
      }
      std::this_thread::yield();
    }
    ADD_FAILURE() << "condition not met within " << timeout.count() << " ms";
    return std::chrono::duration_cast<std::chrono::microseconds>(timeout);
  }

  // Waits until a counter reaches `target`.
  void wait_counter(const std::atomic<uint64_t>& c, uint64_t target) {
    const auto deadline = Clock::now() + 5s;
    while (c.load() < target && Clock::now() < deadline) std::this_thread::yield();
    ASSERT_GE(c.load(), target);
  }

  static proto::Registration registration(proto::RegistrationFormat format, std::string host, uint16_t port) {
    proto::Registration r;
    r.format = format;
    r.role = proto::Role::kDecode;
    r.http_address = {std::move(host), port};
    if (format == proto::RegistrationFormat::kP2pNccl) {
      r.zmq_address = r.http_address.host + ":21001";
    } else {
      r.moriio_zmq = proto::MoriioZmqAddress{r.http_address.host, 6301, 61005};
      r.zmq_address = r.moriio_zmq->to_string();
      r.transfer_mode = proto::TransferMode::kRead;
      r.dp_size = 2;
      r.tp_size = 4;
    }
    if (format == proto::RegistrationFormat::kPdrouter) {
      r.schema_version = 1;
      r.connector = proto::Connector::kMoriio;
      r.epoch = 42;
      r.instance_id = "node-a";
    }
    return r;
  }

  SnapshotCell<RegistrySnapshot> cell_;
  DiscoveryCounters counters_;
  DiscoveryService service_{cell_, counters_};
  zmq::context_t ctx_{1};
  std::string endpoint_;
};

TEST_F(DiscoveryServiceTest, EveryDialectBecomesVisibleWithin200ms) {
  start();
  struct Case {
    proto::RegistrationFormat format;
    const char* host;
    proto::Connector connector;
  } cases[] = {
      {proto::RegistrationFormat::kMoriio, "127.0.0.1", proto::Connector::kMoriio},
      {proto::RegistrationFormat::kMoriioLegacy, "127.0.0.2", proto::Connector::kMoriio},
      {proto::RegistrationFormat::kP2pNccl, "127.0.0.3", proto::Connector::kP2pNccl},
      {proto::RegistrationFormat::kPdrouter, "127.0.0.4", proto::Connector::kMoriio},
  };
  auto sock = dealer();
  for (const auto& c : cases) {
    const auto reg = registration(c.format, c.host, 8000);
    const std::string key = reg.http_address.to_string();
    send(sock, proto::encode_registration(reg));
    const auto took = wait_until([&](const RegistrySnapshot& s) { return s.find(key) != nullptr; });
    EXPECT_LT(took, test::scaled(200ms)) << proto::to_string(c.format);
    const Instance* inst = cell_.load()->find(key);
    ASSERT_NE(inst, nullptr);
    EXPECT_EQ(inst->format, c.format);
    EXPECT_EQ(inst->connector, c.connector);
    EXPECT_EQ(inst->role, proto::Role::kDecode);
    EXPECT_EQ(inst->state, InstanceState::kUp);
  }
  EXPECT_EQ(counters_.rejected_total(), 0u);
}

// A P2P-NCCL node uses its zmq_address as routing id; its restarted process (same id) must be
// heard while the old process's connection is still open.
TEST_F(DiscoveryServiceTest, ARestartedNodeWithTheSameRoutingIdIsHeard) {
  start();
  auto old_process = dealer_with_routing_id("127.0.0.9:21001");
  send(old_process, proto::encode_registration(registration(proto::RegistrationFormat::kP2pNccl, "127.0.0.9", 8000)));
  wait_until([](const RegistrySnapshot& s) { return s.find("127.0.0.9:8000") != nullptr; });
  auto new_process = dealer_with_routing_id("127.0.0.9:21001");  // the old one stays connected
  auto moved = registration(proto::RegistrationFormat::kP2pNccl, "127.0.0.9", 8001);
  send(new_process, proto::encode_registration(moved));
  wait_until([](const RegistrySnapshot& s) { return s.find("127.0.0.9:8001") != nullptr; });
}

TEST_F(DiscoveryServiceTest, PdrouterFormatIsAcknowledgedAfterItIsVisible) {
  start();
  auto sock = dealer();
  send(sock, proto::encode_registration(registration(proto::RegistrationFormat::kPdrouter, "127.0.0.5", 8000)));
  zmq::message_t reply;
  sock.set(zmq::sockopt::rcvtimeo, 2000);
  ASSERT_TRUE(sock.recv(reply).has_value()) << "no ack";
  proto::Ack ack;
  ASSERT_TRUE(proto::decode_ack({static_cast<const std::byte*>(reply.data()), reply.size()}, &ack).is_ok());
  EXPECT_TRUE(ack.ok);
  EXPECT_EQ(ack.ttl_ms, 5000u);
  // Acks go out after the publish: the node is visible the moment it holds its ack.
  EXPECT_NE(cell_.load()->find("127.0.0.5:8000"), nullptr);
  EXPECT_GE(cell_.load()->version, ack.registry_version);
}

TEST_F(DiscoveryServiceTest, AuthTokenRequiredForExtendedFormatWhenConfigured) {
  DiscoveryServiceOptions options;
  options.auth_token = "s3cret";
  options.allow_unauthenticated_vllm = false;
  start(options);
  auto sock = dealer();
  auto reg = registration(proto::RegistrationFormat::kPdrouter, "127.0.0.6", 8000);
  reg.auth_token = "wrong";
  send(sock, proto::encode_registration(reg));
  send(sock, proto::encode_registration(registration(proto::RegistrationFormat::kMoriio, "127.0.0.7", 8000)));
  wait_counter(counters_.rejected[static_cast<size_t>(RejectReason::kUnauthenticated)], 2);
  reg.auth_token = "s3cret";
  send(sock, proto::encode_registration(reg));
  wait_until([](const RegistrySnapshot& s) { return s.find("127.0.0.6:8000") != nullptr; });
  EXPECT_EQ(cell_.load()->find("127.0.0.7:8000"), nullptr);
}

TEST_F(DiscoveryServiceTest, WrongFrameCountsAreRejectedAndChangeNothing) {
  start();
  auto sock = dealer();
  const std::string good = proto::encode_registration(registration(proto::RegistrationFormat::kMoriio, "127.0.0.8", 1));
  ASSERT_TRUE(sock.send(zmq::buffer(good), zmq::send_flags::sndmore).has_value());
  ASSERT_TRUE(sock.send(zmq::buffer(good), zmq::send_flags::none).has_value());
  ASSERT_TRUE(sock.send(zmq::str_buffer(""), zmq::send_flags::sndmore).has_value());
  ASSERT_TRUE(sock.send(zmq::buffer(good), zmq::send_flags::none).has_value());
  wait_counter(counters_.rejected[static_cast<size_t>(RejectReason::kBadFrames)], 2);
  EXPECT_TRUE(cell_.load()->instances.empty());
  // The socket still works afterwards.
  send(sock, good);
  wait_until([](const RegistrySnapshot& s) { return s.find("127.0.0.8:1") != nullptr; });
}

TEST_F(DiscoveryServiceTest, TopologyChangesApplyLive) {
  start();
  config::Topology t;
  config::StaticInstance s;
  s.role = proto::Role::kPrefill;
  s.http_address = {"127.0.1.1", 9000};
  s.connector = proto::Connector::kNixl;
  t.static_instances.push_back(s);
  t.discovery.ttl = 2000ms;
  service_.apply_topology(t);
  wait_until([](const RegistrySnapshot& snap) { return snap.find("127.0.1.1:9000") != nullptr; });
  EXPECT_EQ(cell_.load()->find("127.0.1.1:9000")->source, InstanceSource::kStatic);

  // The new TTL applies to the next registration.
  auto sock = dealer();
  send(sock, proto::encode_registration(registration(proto::RegistrationFormat::kMoriio, "127.0.1.2", 1)));
  wait_until([](const RegistrySnapshot& snap) { return snap.find("127.0.1.2:1") != nullptr; });
  EXPECT_EQ(cell_.load()->find("127.0.1.2:1")->ttl, 2000ms);

  t.static_instances.clear();
  service_.apply_topology(t);
  wait_until([](const RegistrySnapshot& snap) { return snap.find("127.0.1.1:9000") == nullptr; });
}

TEST_F(DiscoveryServiceTest, InstanceExpiresOnItsOwnDeadline) {
  DiscoveryServiceOptions options;
  options.registry.default_ttl = 300ms;
  options.registry.min_ttl = 100ms;
  start(options);
  auto sock = dealer();
  send(sock, proto::encode_registration(registration(proto::RegistrationFormat::kMoriio, "127.0.2.1", 1)));
  wait_until([](const RegistrySnapshot& s) { return s.find("127.0.2.1:1") != nullptr; });
  const auto took = wait_until([](const RegistrySnapshot& s) {
    const Instance* i = s.find("127.0.2.1:1");
    return i != nullptr && i->state == InstanceState::kExpired;
  });
  EXPECT_GE(took, 200ms);
  EXPECT_LT(took, test::scaled(1300ms));  // TTL + 1 s
  EXPECT_EQ(counters_.expiries.load(), 1u);
}

TEST_F(DiscoveryServiceTest, PostedCompletionRunsAfterTheChangeIsPublished) {
  start();
  std::promise<std::pair<bool, uint64_t>> seen;  // (instance visible, snapshot version) at completion
  config::StaticInstance spec;
  spec.http_address = {"127.9.0.1", 8000};
  spec.connector = proto::Connector::kNixl;
  service_.post([&](Registry& registry) { registry.add_admin(spec, Clock::now()); },
                [&] {
                  auto snap = cell_.load();
                  seen.set_value({snap->find("127.9.0.1:8000") != nullptr, snap->version});
                });
  auto future = seen.get_future();
  ASSERT_EQ(future.wait_for(test::scaled(5000ms)), std::future_status::ready);
  EXPECT_TRUE(future.get().first) << "completion ran before the snapshot showing the change";

  // Nothing changed: the completion still runs, and no snapshot is published for it.
  std::promise<uint64_t> unchanged;
  const uint64_t before = cell_.version();
  service_.post([](Registry& registry) { (void)registry.remove("127.9.0.2:8000"); },
                [&] { unchanged.set_value(cell_.version()); });
  auto f2 = unchanged.get_future();
  ASSERT_EQ(f2.wait_for(test::scaled(5000ms)), std::future_status::ready);
  EXPECT_EQ(f2.get(), before);
}

TEST_F(DiscoveryServiceTest, BindFailureIsReported) {
  start();
  SnapshotCell<RegistrySnapshot> other_cell;
  DiscoveryCounters other_counters;
  DiscoveryService other(other_cell, other_counters);
  DiscoveryServiceOptions options;
  options.bind_endpoint = endpoint_;  // already bound by the fixture's service
  Status st = other.start(options);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("cannot bind"), std::string::npos) << st.message();
}

// ---- admission control: unlisted hosts, weaker senders, goodbyes, epochs ---------------

config::Cidr cidr(std::string_view text) {
  config::Cidr c;
  EXPECT_TRUE(config::parse_cidr(text, &c).is_ok()) << text;
  return c;
}

size_t refusals(const DiscoveryCounters& c, HandshakeRefusal r) {
  return c.handshakes_refused[static_cast<size_t>(r)].load();
}

TEST_F(DiscoveryServiceTest, PeerOutsideTheAllowListNeverGetsAMessageIn) {
  DiscoveryServiceOptions options;
  options.zap.allowed_peers.cidrs = {cidr("127.0.0.7/32")};
  start(options);
  // The attack: one MoRIIO message from a host nobody listed.
  auto rogue = dealer();  // connects from 127.0.0.1
  send(rogue, proto::encode_registration(registration(proto::RegistrationFormat::kMoriio, "127.0.0.1", 8000)));
  wait_counter(counters_.handshakes_refused[static_cast<size_t>(HandshakeRefusal::kAddressNotAllowed)], 1);
  // A listed peer gets in through the same socket.
  zmq::socket_t listed(ctx_, zmq::socket_type::dealer);
  listed.set(zmq::sockopt::linger, 1000);
  listed.connect("tcp://127.0.0.7:0;" + endpoint_.substr(6));  // source address 127.0.0.7
  send(listed, proto::encode_registration(registration(proto::RegistrationFormat::kMoriio, "127.0.0.7", 8000)));
  wait_until([](const RegistrySnapshot& s) { return s.find("127.0.0.7:8000") != nullptr; });
  EXPECT_EQ(cell_.load()->find("127.0.0.1:8000"), nullptr);
  EXPECT_EQ(counters_.frames_received.load(), 1u);  // the refused peer's frame never arrived
  EXPECT_EQ(cell_.load()->find("127.0.0.7:8000")->admission, config::AdmissionClass::kAddress);
}

TEST_F(DiscoveryServiceTest, UnauthenticatedNodeMayRegisterOnlyItsOwnAddress) {
  start();
  auto sock = dealer();  // from 127.0.0.1
  // 192.0.2.0/24 is RFC 5737 documentation space: refused here, so it never receives traffic.
  send(sock, proto::encode_registration(registration(proto::RegistrationFormat::kMoriio, "192.0.2.10", 8000)));
  wait_counter(counters_.rejected[static_cast<size_t>(RejectReason::kNotSelf)], 1);
  send(sock, proto::encode_registration(registration(proto::RegistrationFormat::kMoriio, "127.0.0.1", 8000)));
  wait_until([](const RegistrySnapshot& s) { return s.find("127.0.0.1:8000") != nullptr; });
  EXPECT_EQ(cell_.load()->find("192.0.2.10:8000"), nullptr);
}

TEST_F(DiscoveryServiceTest, TokenlessVllmMessageCannotOverwriteATokenEntry) {
  DiscoveryServiceOptions options;
  options.auth_token = "s3cret";  // allow_unauthenticated_vllm stays true, the default
  start(options);
  auto node = dealer();
  auto legit = registration(proto::RegistrationFormat::kPdrouter, "127.0.0.1", 8000);
  legit.auth_token = "s3cret";
  send(node, proto::encode_registration(legit));
  wait_until([](const RegistrySnapshot& s) { return s.find("127.0.0.1:8000") != nullptr; });
  EXPECT_EQ(cell_.load()->find("127.0.0.1:8000")->admission, config::AdmissionClass::kToken);
  auto rogue = dealer();
  auto takeover = registration(proto::RegistrationFormat::kMoriio, "127.0.0.1", 8000);
  takeover.role = proto::Role::kPrefill;
  takeover.moriio_zmq = proto::MoriioZmqAddress{"127.0.0.66", 1, 2};
  takeover.zmq_address = takeover.moriio_zmq->to_string();
  send(rogue, proto::encode_registration(takeover));
  wait_counter(counters_.rejected[static_cast<size_t>(RejectReason::kWeakerSender)], 1);
  // A token-less goodbye (pdrouter format only) is refused as unauthenticated.
  send(rogue, proto::encode_goodbye(proto::Goodbye{{"127.0.0.1", 8000}, 1, "", 42, ""}));
  wait_counter(counters_.rejected[static_cast<size_t>(RejectReason::kUnauthenticated)], 1);
  const Instance* inst = cell_.load()->find("127.0.0.1:8000");
  ASSERT_NE(inst, nullptr);
  EXPECT_EQ(inst->role, proto::Role::kDecode);
  EXPECT_EQ(inst->format, proto::RegistrationFormat::kPdrouter);
  EXPECT_EQ(inst->zmq_address, legit.zmq_address);
}

TEST_F(DiscoveryServiceTest, SpoofedGoodbyeLeavesAStaticInstanceUp) {
  DiscoveryServiceOptions options;
  config::StaticInstance s;
  s.role = proto::Role::kDecode;
  s.http_address = {"127.0.0.1", 9000};
  s.connector = proto::Connector::kNixl;
  options.static_instances = {s};
  start(options);
  auto sock = dealer();
  send(sock, proto::encode_goodbye(proto::Goodbye{{"127.0.0.1", 9000}, 1, "", 0, ""}));
  zmq::message_t reply;
  sock.set(zmq::sockopt::rcvtimeo, static_cast<int>(2000 * test::time_scale()));
  ASSERT_TRUE(sock.recv(reply).has_value()) << "no ack";
  proto::Ack ack;
  ASSERT_TRUE(proto::decode_ack({static_cast<const std::byte*>(reply.data()), reply.size()}, &ack).is_ok());
  EXPECT_FALSE(ack.ok);
  EXPECT_NE(ack.reason.find("static"), std::string::npos) << ack.reason;
  EXPECT_EQ(counters_.rejected[static_cast<size_t>(RejectReason::kOperatorOwned)].load(), 1u);
  EXPECT_EQ(cell_.load()->find("127.0.0.1:9000")->state, InstanceState::kUp);
}

class CurveDiscoveryTest : public DiscoveryServiceTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(proto::generate_curve_key_pair(&server_).is_ok());
    ASSERT_TRUE(proto::generate_curve_key_pair(&sidecar_).is_ok());
    ASSERT_TRUE(proto::generate_curve_key_pair(&stranger_).is_ok());
    DiscoveryServiceOptions options;
    options.curve_endpoint = "tcp://127.0.0.1:0";
    options.curve_keys = server_;
    options.zap.allowed_client_keys = {sidecar_.public_z85};
    start(options);
    curve_endpoint_ = service_.bound_curve_endpoint();
    ASSERT_NE(curve_endpoint_.find("tcp://127.0.0.1:"), std::string::npos) << curve_endpoint_;
  }

  std::unique_ptr<sidecar::NodeClient> client(const proto::CurveKeyPair& keys, const std::string& host) {
    sidecar::NodeClientOptions o;
    o.router_endpoints = {curve_endpoint_};
    o.registration = registration(proto::RegistrationFormat::kPdrouter, host, 8000);
    o.interval = 50ms;
    o.curve_server_key = server_.public_z85;
    o.curve_public_key = keys.public_z85;
    o.curve_secret_key = keys.secret_z85;
    return std::make_unique<sidecar::NodeClient>(std::move(o));
  }

  proto::CurveKeyPair server_, sidecar_, stranger_;
  std::string curve_endpoint_;
};

TEST_F(CurveDiscoveryTest, ListedKeyRegistersAnyAddressAndAnUnlistedKeyIsRefused) {
  // A sidecar may register the vLLM server it stands beside, wherever that is.
  auto good = client(sidecar_, "127.0.0.9");
  ASSERT_TRUE(good->start().is_ok());
  wait_until([](const RegistrySnapshot& s) { return s.find("127.0.0.9:8000") != nullptr; });
  EXPECT_EQ(cell_.load()->find("127.0.0.9:8000")->admission, config::AdmissionClass::kCurve);
  auto bad = client(stranger_, "127.0.0.10");
  ASSERT_TRUE(bad->start().is_ok());
  wait_counter(counters_.handshakes_refused[static_cast<size_t>(HandshakeRefusal::kKeyNotAllowed)], 1);
  bad->stop(false);
  EXPECT_EQ(cell_.load()->find("127.0.0.10:8000"), nullptr);
  // The plain endpoint cannot change, or say goodbye to, what the CURVE sidecar registered.
  auto plain = dealer();
  auto rogue = registration(proto::RegistrationFormat::kMoriio, "127.0.0.9", 8000);
  rogue.role = proto::Role::kPrefill;
  send(plain, proto::encode_registration(rogue));
  send(plain, proto::encode_goodbye(proto::Goodbye{{"127.0.0.9", 8000}, 1, "", 42, ""}));
  wait_counter(counters_.rejected[static_cast<size_t>(RejectReason::kWeakerSender)], 2);
  EXPECT_EQ(cell_.load()->find("127.0.0.9:8000")->role, proto::Role::kDecode);
  // Its goodbye, with the current epoch, removes it.
  good->stop(true);
  wait_until([](const RegistrySnapshot& s) { return s.find("127.0.0.9:8000") == nullptr; });
  EXPECT_EQ(refusals(counters_, HandshakeRefusal::kAddressNotAllowed), 0u);
}

}  // namespace
}  // namespace pdr::discovery
