// NodeSpec: the one node description (equality covers every field, the leg part included) and the
// parsed forms of an operator's zmq_address.
#include "proto/node_spec.h"

#include <gtest/gtest.h>

#include "proto/discovery_message.h"
#include "proto/request_legs.h"

namespace pdr::proto {
namespace {

NodeSpec moriio_node() {
  NodeSpec n;
  n.role = Role::kDecode;
  n.connector = Connector::kMoriio;
  n.transfer_mode = TransferMode::kRead;
  n.http_address = {"127.0.0.1", 8200};
  n.zmq_address = "host:127.0.0.1,handshake:6401,notify:61105";
  n.dp_size = 2;
  n.model = "m";
  n.labels = {{"zone", "a"}};
  return n;
}

TEST(NodeSpec, EqualityCoversEveryField) {
  const NodeSpec a = moriio_node();
  EXPECT_EQ(a, moriio_node());
  NodeSpec b = a;
  b.labels = {{"zone", "b"}};
  EXPECT_NE(a, b);
  b = a;
  b.model = "other";
  EXPECT_NE(a, b);
  b = a;
  b.kv_address = HostPort{"127.0.0.1", 1};
  EXPECT_NE(a, b);
  b = a;
  b.bootstrap_port = 8998;
  EXPECT_NE(a, b);
}

TEST(NodeSpec, TheOtherDescriptionsShareIt) {
  Registration reg;
  static_cast<NodeSpec&>(reg) = moriio_node();
  EXPECT_EQ(reg.zmq_address, "host:127.0.0.1,handshake:6401,notify:61105");
  EXPECT_EQ(static_cast<const NodeSpec&>(reg), moriio_node());

  LegInstance leg;
  static_cast<NodeEndpoint&>(leg) = reg;
  EXPECT_EQ(leg.http_address, (HostPort{"127.0.0.1", 8200}));
  EXPECT_EQ(leg.dp_size, 2u);
  EXPECT_EQ(static_cast<const NodeEndpoint&>(leg), static_cast<const NodeEndpoint&>(reg));
}

TEST(FillParsedZmqAddress, MoriioCompositeForm) {
  NodeSpec n = moriio_node();
  fill_parsed_zmq_address(&n);
  ASSERT_TRUE(n.moriio_zmq.has_value());
  EXPECT_EQ(*n.moriio_zmq, (MoriioZmqAddress{"127.0.0.1", 6401, 61105}));
  EXPECT_FALSE(n.kv_address.has_value());
}

TEST(FillParsedZmqAddress, HostPortForm) {
  NodeSpec n;
  n.zmq_address = "[::1]:21001";
  fill_parsed_zmq_address(&n);
  ASSERT_TRUE(n.kv_address.has_value());
  EXPECT_EQ(*n.kv_address, (HostPort{"::1", 21001}));
  EXPECT_FALSE(n.moriio_zmq.has_value());
}

TEST(FillParsedZmqAddress, EmptyOrUnparseableLeavesBothUnset) {
  for (const char* text : {"", "host:127.0.0.1,handshake:x,notify:1", "no-port", "127.0.0.1:0"}) {
    NodeSpec n;
    n.zmq_address = text;
    fill_parsed_zmq_address(&n);
    EXPECT_FALSE(n.moriio_zmq.has_value()) << text;
    EXPECT_FALSE(n.kv_address.has_value()) << text;
  }
}

TEST(FillParsedZmqAddress, KeepsWhatIsAlreadyParsed) {
  NodeSpec n = moriio_node();
  n.moriio_zmq = MoriioZmqAddress{"127.0.0.9", 1, 2};
  fill_parsed_zmq_address(&n);
  EXPECT_EQ(*n.moriio_zmq, (MoriioZmqAddress{"127.0.0.9", 1, 2}));
}

}  // namespace
}  // namespace pdr::proto
