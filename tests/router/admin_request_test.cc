// Admin API body and path validation: strict JSON, the topology file's instance rules, the demo
// proxy's /instances/add messages, and instance addresses in paths.
#include "router/admin_request.h"

#include <gtest/gtest.h>

namespace pdr::router {
namespace {

config::Topology::Connectors defaults() { return {}; }  // moriio, WRITE, bootstrap 8998

Status parse(std::string_view body, config::StaticInstance* out = nullptr) {
  config::StaticInstance ignored;
  return parse_admin_instance(body, defaults(), out != nullptr ? out : &ignored);
}

void expect_error(std::string_view body, std::string_view message) {
  Status s = parse(body);
  EXPECT_FALSE(s.is_ok()) << body;
  EXPECT_NE(s.message().find(message), std::string::npos) << body << " -> " << s.message();
}

TEST(AdminRequest, FullInstance) {
  config::StaticInstance inst;
  ASSERT_TRUE(parse(R"({"role":"decode","http_address":"127.0.10.1:8200","connector":"moriio",
      "transfer_mode":"READ","zmq_address":"host:127.0.10.1,handshake:6301,notify:61005",
      "dp_size":2,"tp_size":8,"model":"m","labels":{"zone":"a","gpu":"x"}})",
                    &inst)
                  .is_ok());
  EXPECT_EQ(inst.role, proto::Role::kDecode);
  EXPECT_EQ(inst.http_address.to_string(), "127.0.10.1:8200");
  EXPECT_EQ(inst.transfer_mode, proto::TransferMode::kRead);
  EXPECT_EQ(inst.dp_size, 2u);
  EXPECT_EQ(inst.tp_size, 8u);
  ASSERT_EQ(inst.labels.size(), 2u);
  EXPECT_EQ(inst.labels[0].first, "gpu");  // sorted, as the topology file's
}

TEST(AdminRequest, DefaultsComeFromTheTopology) {
  config::StaticInstance inst;
  ASSERT_TRUE(parse(R"({"role":"prefill","http_address":"[::1]:8100","connector":"mooncake"})", &inst).is_ok());
  EXPECT_EQ(inst.bootstrap_port, 8998);  // connectors.mooncake_bootstrap_port
  EXPECT_EQ(inst.http_address.to_string(), "[::1]:8100");
  expect_error(R"({"role":"prefill","http_address":"a:1"})", "connector moriio needs zmq_address");
}

TEST(AdminRequest, KvEventsEndpoints) {
  config::StaticInstance inst;
  ASSERT_TRUE(parse(R"({"role":"decode","http_address":"127.0.10.1:8200","connector":"nixl",
      "kv_events_endpoint":"tcp://127.0.10.1:5557","kv_events_replay_endpoint":"tcp://127.0.10.1:5600"})",
                    &inst)
                  .is_ok());
  EXPECT_EQ(inst.kv_events_endpoint, (proto::HostPort{"127.0.10.1", 5557}));
  EXPECT_EQ(inst.kv_events_replay_endpoint, (proto::HostPort{"127.0.10.1", 5600}));
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"nixl","kv_events_endpoint":"tcp://*:5557"})",
               "kv_events_endpoint: host '*' is the publisher's bind form");
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"nixl","kv_events_replay_endpoint":"ipc:///x"})",
               "kv_events_replay_endpoint: scheme 'ipc' names a socket on the router's own host");
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"nixl","kv_events_endpoint":5557})",
               "kv_events_endpoint: expected a string");
}

TEST(AdminRequest, StrictBodies) {
  expect_error("", "not valid JSON");
  expect_error("[1]", "body must be a JSON object, got an array");
  expect_error(R"({"role":"decode","role":"prefill","http_address":"a:1"})", "duplicate key 'role'");
  expect_error(R"({"role":"decode","http_adress":"a:1"})", "unknown key 'http_adress' (did you mean 'http_address'?)");
  expect_error(R"({"http_address":"a:1","connector":"nixl"})", "missing key 'role'");
  expect_error(R"({"role":"decode","connector":"nixl"})", "missing key 'http_address'");
  expect_error(R"({"role":"middle","http_address":"a:1"})", "role: unknown role 'middle'");
  expect_error(R"({"role":7,"http_address":"a:1"})", "role: expected a string, got 7");
  expect_error(R"({"role":"decode","http_address":"a:0","connector":"nixl"})", "http_address: ");
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"nixl","dp_size":"2"})",
               "dp_size: expected an integer, got the string '2'");
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"nixl","dp_size":2.0})",
               "dp_size: expected an integer");
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"nixl","tp_size":0})",
               "tp_size: 0 is out of range (1..1024)");
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"nixl","dp_size":-1})",
               "dp_size: -1 is out of range");
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"p2p-nccl","zmq_address":"x"})",
               "zmq_address: ");
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"nixl","model":"a\u0001"})",
               "model: contains control characters");
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"nixl","labels":{"a":{"b":"c"}}})",
               "nests deeper");
  expect_error(R"({"role":"decode","http_address":"a:1","connector":"nixl","labels":{"a":1}})",
               "labels: a: expected a string");
  expect_error(std::string(kMaxAdminBodyBytes + 1, ' '), "limit 16384");
  // Deep nesting is refused without building the tree.
  expect_error(std::string(5000, '[') + std::string(5000, ']'), "nests deeper");
}

TEST(AdminRequest, SeedAddBody) {
  config::Topology::Connectors nixl;
  nixl.default_connector = proto::Connector::kNixl;
  config::StaticInstance inst;
  ASSERT_TRUE(parse_seed_add_instance(R"({"type":"prefill","instance":"localhost:8102"})", nixl, &inst).is_ok());
  EXPECT_EQ(inst.role, proto::Role::kPrefill);
  EXPECT_EQ(inst.http_address.to_string(), "localhost:8102");
  EXPECT_EQ(inst.connector, proto::Connector::kNixl);

  auto message = [&](std::string_view body, const config::Topology::Connectors& d) {
    config::StaticInstance out;
    Status s = parse_seed_add_instance(body, d, &out);
    EXPECT_FALSE(s.is_ok()) << body;
    return s.message();
  };
  EXPECT_EQ(message(R"({"type":"P","instance":"a:1"})", nixl).rfind("Invalid instance type.", 0), 0u);
  EXPECT_EQ(message(R"({"type":"decode","instance":"a"})", nixl).rfind("Invalid instance format.", 0), 0u);
  EXPECT_EQ(message(R"({"type":"decode"})", nixl).rfind("Invalid instance format.", 0), 0u);
  EXPECT_EQ(message(R"({"type":"decode","instance":"a:99999"})", nixl).rfind("Invalid instance address.", 0), 0u);
  EXPECT_NE(message(R"({"type":"decode","instance":"a:1"})", defaults()).find("POST /admin/instances"),
            std::string::npos);
}

TEST(AdminRequest, InstanceKeyInPath) {
  std::string key;
  ASSERT_TRUE(parse_instance_key("127.0.10.1:8000", &key).is_ok());
  EXPECT_EQ(key, "127.0.10.1:8000");
  ASSERT_TRUE(parse_instance_key("%5B::1%5d:8000", &key).is_ok());
  EXPECT_EQ(key, "[::1]:8000");
  EXPECT_FALSE(parse_instance_key("127.0.10.1", &key).is_ok());
  EXPECT_FALSE(parse_instance_key("a%2", &key).is_ok());
  EXPECT_FALSE(parse_instance_key("a%zz:1", &key).is_ok());
}

}  // namespace
}  // namespace pdr::router
