#include "discovery/config/topology.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "discovery/config/topology_store.h"
#include "discovery/config/topology_warnings.h"
#include "tests/support/source_path.h"

namespace pdr::config {
namespace {

using ::testing::Eq;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using namespace std::chrono_literals;

Status parse(const std::string& text, Topology* out) {
  return parse_topology(text, "topo.yaml", out);
}

// Parses text expected to be invalid; returns the message.
std::string error_of(const std::string& text, StatusCode expected_code) {
  Topology t;
  Status s = parse(text, &t);
  EXPECT_FALSE(s.is_ok()) << "accepted:\n" << text;
  EXPECT_EQ(s.code(), expected_code) << s.to_string();
  return s.message();
}

class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "pdr-topo-XXXXXX").string();
    path_ = ::mkdtemp(templ.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(file(name), std::ios::binary | std::ios::trunc) << content;
    return file(name);
  }

 private:
  std::string path_;
};

// Sets an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST(TopologyParse, EmptyTextGivesDefaults) {
  for (const char* text : {"", "# only a comment\n\n# another\n", "---\n"}) {
    Topology t;
    t.workers = 99;
    ASSERT_TRUE(parse(text, &t).is_ok()) << text;
    const Topology d;
    EXPECT_EQ(t.workers, 0u);
    EXPECT_EQ(t.listeners.http, (proto::HostPort{"0.0.0.0", 10001}));
    EXPECT_EQ(t.listeners.discovery, "tcp://*:36367");
    EXPECT_EQ(t.discovery.ttl, d.discovery.ttl);
    EXPECT_EQ(t.policies.decode, PolicyName::kRoundRobin);
    EXPECT_EQ(t.connectors.default_connector, proto::Connector::kMoriio);
    EXPECT_EQ(t.connectors.default_transfer_mode, proto::TransferMode::kWrite);
    EXPECT_EQ(t.timeouts.connect, 2000ms);
    EXPECT_EQ(t.retries.prefill_attempts, 2u);
    EXPECT_EQ(t.retries.eject_after_connect_failures, 3u);
    EXPECT_EQ(t.retries.eject, 5000ms);
    EXPECT_EQ(t.limits.max_body_bytes, 32u * 1024 * 1024);
    EXPECT_EQ(t.limits.max_buffered_bytes, 1u << 30);
    EXPECT_EQ(t.timeouts.client_write, 30000ms);
    EXPECT_EQ(t.timeouts.request, 0ms);
    EXPECT_TRUE(t.admin.api_key.empty());
    EXPECT_TRUE(t.static_instances.empty());
    EXPECT_TRUE(t.source_path.empty());
  }
}

TEST(TopologyParse, EmptySectionsGiveDefaults) {
  Topology t;
  ASSERT_TRUE(parse("listeners:\ntimeouts: {}\ninstances: []\n", &t).is_ok());
  EXPECT_EQ(t.timeouts.drain, 30000ms);
  EXPECT_TRUE(t.static_instances.empty());
}

TEST(TopologyParse, FullFileSetsEveryField) {
  ScopedEnv token("PDR_TEST_DISCOVERY_TOKEN", "disc-token");
  ScopedEnv upstream("PDR_TEST_UPSTREAM_KEY", "up-key");
  ScopedEnv admin("PDR_TEST_ADMIN_KEY", "admin-key");
  const std::string text = R"(
listeners:
  http: "127.0.0.1:0"
  discovery: "tcp://127.0.0.1:0"
workers: 4
discovery:
  ttl_ms: 7000
  min_ttl_ms: 2000
  max_ttl_ms: 9000
  expired_retention_ms: 0
  max_instances: 100
  max_message_bytes: 4096
  auth_token_env: PDR_TEST_DISCOVERY_TOKEN
  allow_unauthenticated_vllm: false
policies:
  prefill: least_outstanding
  decode: affinity
  affinity_header: x-session-id
  affinity_prefix_bytes: 128
connectors:
  default: p2p-nccl
  default_transfer_mode: READ
  mooncake_bootstrap_port: 9000
  upstream_api_key_env: PDR_TEST_UPSTREAM_KEY
timeouts:
  connect_ms: 100
  prefill_ms: 200
  first_byte_ms: 300
  stream_idle_ms: 400
  header_read_ms: 500
  body_read_ms: 550
  keep_alive_idle_ms: 600
  drain_ms: 700
  client_write_ms: 900
  request_ms: 1100
retries:
  prefill_attempts: 3
  decode_attempts: 1
  eject_after_connect_failures: 0
  eject_ms: 800
limits:
  max_body_bytes: 1000
  max_header_bytes: 2000
  max_concurrent_requests: 30
  max_queued_requests: 12
  max_queued_bytes: 3000
  queue_timeout_ms: 1300
  max_connections: 40
  max_buffered_bytes: 5000000
admin:
  api_key_env: PDR_TEST_ADMIN_KEY
instances:
  - role: prefill
    http_address: "127.0.10.1:8100"
    connector: moriio
    zmq_address: "host:127.0.10.1,handshake:6301,notify:61005"
    dp_size: 2
    tp_size: 4
    model: m
    labels: {zone: b, rack: "1"}
  - role: decode
    http_address: "[::1]:8200"
    zmq_address: "127.0.10.2:21001"
  - role: P
    http_address: "node-3.example:8300"
    connector: mooncake
  - role: decode
    http_address: "127.0.10.4:8400"
    connector: moriio
    transfer_mode: read
    zmq_address: "host:127.0.10.4,handshake:6301,notify:61005"
    bootstrap_port: 7000
)";
  Topology t;
  Status s = parse(text, &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.listeners.http, (proto::HostPort{"127.0.0.1", 0}));
  EXPECT_EQ(t.listeners.discovery, "tcp://127.0.0.1:0");
  EXPECT_EQ(t.workers, 4u);
  EXPECT_EQ(t.discovery.ttl, 7000ms);
  EXPECT_EQ(t.discovery.min_ttl, 2000ms);
  EXPECT_EQ(t.discovery.max_ttl, 9000ms);
  EXPECT_EQ(t.discovery.expired_retention, 0ms);
  EXPECT_EQ(t.discovery.max_instances, 100u);
  EXPECT_EQ(t.discovery.max_message_bytes, 4096u);
  EXPECT_EQ(t.discovery.auth_token, "disc-token");
  EXPECT_EQ(t.discovery.auth_token_env, "PDR_TEST_DISCOVERY_TOKEN");
  EXPECT_FALSE(t.discovery.allow_unauthenticated_vllm);
  EXPECT_EQ(t.policies.prefill, PolicyName::kLeastOutstanding);
  EXPECT_EQ(t.policies.decode, PolicyName::kAffinity);
  EXPECT_EQ(t.policies.affinity_header, "x-session-id");
  EXPECT_EQ(t.policies.affinity_prefix_bytes, 128u);
  EXPECT_EQ(t.connectors.default_connector, proto::Connector::kP2pNccl);
  EXPECT_EQ(t.connectors.default_transfer_mode, proto::TransferMode::kRead);
  EXPECT_EQ(t.connectors.mooncake_bootstrap_port, 9000);
  EXPECT_EQ(t.connectors.upstream_api_key, "up-key");
  EXPECT_EQ(t.connectors.upstream_api_key_env, "PDR_TEST_UPSTREAM_KEY");
  EXPECT_EQ(t.timeouts.connect, 100ms);
  EXPECT_EQ(t.timeouts.prefill, 200ms);
  EXPECT_EQ(t.timeouts.first_byte, 300ms);
  EXPECT_EQ(t.timeouts.stream_idle, 400ms);
  EXPECT_EQ(t.timeouts.header_read, 500ms);
  EXPECT_EQ(t.timeouts.body_read, 550ms);
  EXPECT_EQ(t.timeouts.keep_alive_idle, 600ms);
  EXPECT_EQ(t.timeouts.drain, 700ms);
  EXPECT_EQ(t.timeouts.client_write, 900ms);
  EXPECT_EQ(t.timeouts.request, 1100ms);
  EXPECT_EQ(t.retries.prefill_attempts, 3u);
  EXPECT_EQ(t.retries.decode_attempts, 1u);
  EXPECT_EQ(t.retries.eject_after_connect_failures, 0u);
  EXPECT_EQ(t.retries.eject, 800ms);
  EXPECT_EQ(t.limits.max_body_bytes, 1000u);
  EXPECT_EQ(t.limits.max_header_bytes, 2000u);
  EXPECT_EQ(t.limits.max_concurrent_requests, 30u);
  EXPECT_EQ(t.limits.max_queued_requests, 12u);
  EXPECT_EQ(t.limits.max_queued_bytes, 3000u);
  EXPECT_EQ(t.limits.queue_timeout, 1300ms);
  EXPECT_TRUE(t.limits.queue_enabled());
  EXPECT_EQ(t.limits.max_connections, 40u);
  EXPECT_EQ(t.limits.max_buffered_bytes, 5000000u);
  EXPECT_EQ(t.admin.api_key, "admin-key");
  EXPECT_EQ(t.admin.api_key_env, "PDR_TEST_ADMIN_KEY");
  EXPECT_TRUE(t.admin.api_key_file.empty());

  ASSERT_EQ(t.static_instances.size(), 4u);
  const StaticInstance& p = t.static_instances[0];
  EXPECT_EQ(p.role, proto::Role::kPrefill);
  EXPECT_EQ(p.http_address, (proto::HostPort{"127.0.10.1", 8100}));
  EXPECT_EQ(p.connector, proto::Connector::kMoriio);
  EXPECT_EQ(p.transfer_mode, proto::TransferMode::kRead);  // connectors.default_transfer_mode
  EXPECT_EQ(p.zmq_address, "host:127.0.10.1,handshake:6301,notify:61005");
  EXPECT_EQ(p.dp_size, 2u);
  EXPECT_EQ(p.tp_size, 4u);
  EXPECT_FALSE(p.bootstrap_port.has_value());
  EXPECT_EQ(p.model, "m");
  EXPECT_EQ(p.labels, (proto::Labels{{"rack", "1"}, {"zone", "b"}}));  // sorted by key

  const StaticInstance& d = t.static_instances[1];
  EXPECT_EQ(d.role, proto::Role::kDecode);
  EXPECT_EQ(d.http_address, (proto::HostPort{"::1", 8200}));
  EXPECT_EQ(d.connector, proto::Connector::kP2pNccl);  // connectors.default
  EXPECT_EQ(d.transfer_mode, proto::TransferMode::kNone);
  EXPECT_EQ(d.dp_size, 1u);
  EXPECT_TRUE(d.labels.empty());

  const StaticInstance& mooncake = t.static_instances[2];
  EXPECT_EQ(mooncake.role, proto::Role::kPrefill);
  EXPECT_EQ(mooncake.bootstrap_port, std::optional<uint16_t>(9000));

  const StaticInstance& explicit_mode = t.static_instances[3];
  EXPECT_EQ(explicit_mode.transfer_mode, proto::TransferMode::kRead);
  EXPECT_EQ(explicit_mode.bootstrap_port, std::optional<uint16_t>(7000));
}

TEST(TopologyParse, ExampleFileLoads) {
  // The shipped file's static instances are on the documentation network (10.0.0.x): parsed
  // only, nothing connects to them (test_deploy_examples moves them to loopback before a router
  // loads the file).
  const std::string path = pdr::test::source_path("deploy/topology.example.yaml");
  Topology t;
  Status s = load_topology_file(path, &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.source_path, path);
  EXPECT_EQ(t.listeners.http, (proto::HostPort{"0.0.0.0", 10001}));
  EXPECT_EQ(t.listeners.discovery, "tcp://*:36367");
  ASSERT_EQ(t.static_instances.size(), 2u);
  EXPECT_EQ(t.static_instances[0].role, proto::Role::kPrefill);
  EXPECT_EQ(t.static_instances[1].role, proto::Role::kDecode);
  for (const StaticInstance& inst : t.static_instances) {
    EXPECT_EQ(inst.connector, proto::Connector::kMoriio);
    EXPECT_EQ(inst.transfer_mode, proto::TransferMode::kWrite);
  }
}

TEST(TopologyParse, NixlPushPrefillNeedsItsEngineIdAndSideChannel) {
  Topology t;
  Status s = parse(R"(instances:
  - {role: prefill, http_address: "127.0.10.1:8100", connector: nixl-push, zmq_address: "127.0.10.1:5600",
     engine_id: prefill-a, pp_size: 2, tp_size: 4}
  - {role: decode, http_address: "127.0.10.2:8200", connector: nixl-push}
)",
                   &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  const StaticInstance& p = t.static_instances[0];
  EXPECT_EQ(p.connector, proto::Connector::kNixlPush);
  EXPECT_EQ(p.engine_id, "prefill-a");
  EXPECT_EQ(p.pp_size, 2u);
  EXPECT_EQ(p.zmq_address, "127.0.10.1:5600");
  EXPECT_THAT(error_of("instances:\n  - {role: prefill, http_address: \"127.0.10.1:1\", connector: nixl-push, "
                       "engine_id: e}\n",
                       StatusCode::kMissingKey),
              HasSubstr("a nixl-push prefill needs zmq_address"));
  EXPECT_THAT(error_of("instances:\n  - {role: prefill, http_address: \"127.0.10.1:1\", connector: nixl-push, "
                       "zmq_address: \"127.0.10.1:5600\"}\n",
                       StatusCode::kMissingKey),
              HasSubstr("a nixl-push prefill needs engine_id"));
  EXPECT_THAT(error_of("instances:\n  - {role: decode, http_address: \"127.0.10.1:1\", pp_size: 0}\n",
                       StatusCode::kOutOfRange),
              HasSubstr("pp_size"));
}

TEST(TopologyParse, InvalidSyntaxNamesLineAndColumn) {
  std::string msg = error_of("workers: 1\nlisteners:\n  http: [1, 2\n", StatusCode::kMalformed);
  EXPECT_THAT(msg, StartsWith("topo.yaml:4:1: invalid YAML: "));
  msg = error_of("workers: 1\n\tdiscovery: {}\n", StatusCode::kMalformed);
  EXPECT_THAT(msg, StartsWith("topo.yaml:2:1: invalid YAML: "));
}

TEST(TopologyParse, PortOutOfRange) {
  EXPECT_THAT(error_of("listeners:\n  http: 0.0.0.0:70000\n", StatusCode::kOutOfRange),
              StartsWith("topo.yaml:2:9: listeners.http: port 70000 is out of range (1..65535"));
  EXPECT_THAT(error_of("listeners:\n  discovery: tcp://*:70000\n", StatusCode::kOutOfRange),
              StartsWith("topo.yaml:2:14: listeners.discovery: port 70000 is out of range"));
  EXPECT_THAT(error_of("connectors:\n  mooncake_bootstrap_port: 0\n", StatusCode::kOutOfRange),
              HasSubstr("connectors.mooncake_bootstrap_port: 0 is out of range (1..65535)"));
}

TEST(TopologyParse, DiscoveryEndpointForms) {
  for (const char* ok :
       {"tcp://*:36367", "tcp://*:*", "tcp://*:0", "tcp://[::1]:5555", "ipc:///tmp/pdr.sock"}) {
    Topology t;
    Status s = parse(std::string("listeners: {discovery: \"") + ok + "\"}", &t);
    EXPECT_TRUE(s.is_ok()) << ok << ": " << s.to_string();
    EXPECT_EQ(t.listeners.discovery, ok);
  }
  for (const char* bad : {"udp://*:1", "tcp://*", "tcp://*:abc", "ipc://", "tcp://bad host:1"}) {
    Topology t;
    Status s = parse(std::string("listeners: {discovery: \"") + bad + "\"}", &t);
    EXPECT_FALSE(s.is_ok()) << bad;
    EXPECT_THAT(s.message(), StartsWith("topo.yaml:1:24: listeners.discovery: ")) << bad;
  }
}

TEST(TopologyParse, LoadSignalsSection) {
  Topology defaults;
  ASSERT_TRUE(parse("", &defaults).is_ok());
  EXPECT_FALSE(defaults.load_signals.scrape_engine_metrics);
  EXPECT_EQ(defaults.load_signals.interval, std::chrono::milliseconds(1000));
  EXPECT_EQ(defaults.load_signals.timeout, std::chrono::milliseconds(500));
  EXPECT_EQ(defaults.load_signals.stale_after, std::chrono::milliseconds(3000));
  EXPECT_EQ(defaults.load_signals.max_body_bytes, 4u << 20);

  Topology t;
  Status s = parse(R"(
load_signals:
  scrape_engine_metrics: true
  interval_ms: 250
  timeout_ms: 200
  stale_after_ms: 1000
  max_body_bytes: 65536
)", &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.load_signals.scrape_engine_metrics);
  EXPECT_EQ(t.load_signals.interval, std::chrono::milliseconds(250));
  EXPECT_EQ(t.load_signals.timeout, std::chrono::milliseconds(200));
  EXPECT_EQ(t.load_signals.stale_after, std::chrono::milliseconds(1000));
  EXPECT_EQ(t.load_signals.max_body_bytes, 65536u);

  for (const char* bad : {"interval_ms: 99", "interval_ms: 3600001", "timeout_ms: 9", "timeout_ms: 60001",
                          "stale_after_ms: 99", "max_body_bytes: 1023", "max_body_bytes: 67108865"}) {
    const std::string key(bad, std::string_view(bad).find(':'));
    EXPECT_THAT(error_of(std::string("load_signals:\n  ") + bad + "\n", StatusCode::kOutOfRange),
                HasSubstr("load_signals." + key + ": ")) << bad;
  }
  EXPECT_THAT(error_of("load_signals:\n  interval_ms: 100\n  timeout_ms: 101\n", StatusCode::kOutOfRange),
              HasSubstr("load_signals: timeout_ms (101) must be at most interval_ms (100)"));
  EXPECT_THAT(error_of("load_signals:\n  interval_ms: 5000\n  timeout_ms: 100\n", StatusCode::kOutOfRange),
              HasSubstr("load_signals: stale_after_ms (3000) must be at least interval_ms (5000)"));
  EXPECT_THAT(error_of("load_signals:\n  scrape: true\n", StatusCode::kInvalidValue), HasSubstr("unknown key 'scrape' in load_signals"));
}

TEST(TopologyParse, KvEventsSectionAndInstanceEndpoints) {
  Topology defaults;
  ASSERT_TRUE(parse("", &defaults).is_ok());
  EXPECT_FALSE(defaults.kv_events.enabled);
  EXPECT_FALSE(defaults.kv_events.default_port.has_value());
  EXPECT_EQ(defaults.kv_events.topic, "");
  EXPECT_EQ(defaults.kv_events.max_index_entries, 4'000'000u);
  EXPECT_EQ(defaults.kv_events.max_node_batches_per_sec, 10'000u);
  EXPECT_EQ(defaults.kv_events.max_node_bytes_per_sec, 8u << 20);
  EXPECT_EQ(defaults.kv_events.max_ranks_per_node, 64u);
  EXPECT_EQ(defaults.kv_events.max_subscriptions, 1024u);

  Topology t;
  Status s = parse(R"(
kv_events:
  enabled: true
  default_port: 5557
  topic: "kv@"
  max_index_entries: 1000
  max_node_batches_per_sec: 500
  max_node_bytes_per_sec: 1048576
  max_ranks_per_node: 8
  max_subscriptions: 256
instances:
  - role: decode
    http_address: "127.0.10.4:8400"
    connector: nixl
    kv_events_endpoint: "tcp://127.0.10.4:5557"
    kv_events_replay_endpoint: "tcp://[::1]:5600"
)", &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.kv_events.enabled);
  EXPECT_EQ(t.kv_events.default_port, std::optional<uint16_t>(5557));
  EXPECT_EQ(t.kv_events.topic, "kv@");
  EXPECT_EQ(t.kv_events.max_index_entries, 1000u);
  EXPECT_EQ(t.kv_events.max_node_batches_per_sec, 500u);
  EXPECT_EQ(t.kv_events.max_node_bytes_per_sec, 1048576u);
  EXPECT_EQ(t.kv_events.max_ranks_per_node, 8u);
  EXPECT_EQ(t.kv_events.max_subscriptions, 256u);
  ASSERT_EQ(t.static_instances.size(), 1u);
  EXPECT_EQ(t.static_instances[0].kv_events_endpoint, (proto::HostPort{"127.0.10.4", 5557}));
  EXPECT_EQ(t.static_instances[0].kv_events_replay_endpoint, (proto::HostPort{"::1", 5600}));

  const std::string instance = "instances:\n  - {role: decode, http_address: a:1, connector: nixl, ";
  EXPECT_EQ(error_of(instance + "kv_events_endpoint: \"tcp://*:5557\"}\n", StatusCode::kBadAddress),
            "topo.yaml:2:76: instances[0].kv_events_endpoint: host '*' is the publisher's bind "
            "form; give the node's address to connect to");
  EXPECT_THAT(error_of(instance + "kv_events_replay_endpoint: \"ipc:///tmp/r\"}\n",
                       StatusCode::kBadAddress),
              HasSubstr("instances[0].kv_events_replay_endpoint: scheme 'ipc' names a socket on "
                        "the router's own host"));
  EXPECT_THAT(error_of("kv_events:\n  default_port: 0\n", StatusCode::kOutOfRange),
              HasSubstr("kv_events.default_port: 0 is out of range (1..65535)"));
  EXPECT_THAT(error_of("kv_events:\n  max_index_entries: 0\n", StatusCode::kOutOfRange),
              HasSubstr("kv_events.max_index_entries: 0 is out of range"));
  for (const char* bad : {"max_node_batches_per_sec: 0", "max_node_batches_per_sec: 10000001",
                          "max_node_bytes_per_sec: 65535", "max_node_bytes_per_sec: 1073741825",
                          "max_ranks_per_node: 0", "max_ranks_per_node: 1025", "max_subscriptions: 0",
                          "max_subscriptions: 1000001"}) {
    const std::string key(bad, std::string_view(bad).find(':'));
    EXPECT_THAT(error_of(std::string("kv_events:\n  ") + bad + "\n", StatusCode::kOutOfRange),
                HasSubstr("kv_events." + key + ": ")) << bad;
  }
  EXPECT_THAT(error_of("kv_events:\n  enable: true\n", StatusCode::kInvalidValue),
              HasSubstr("unknown key 'enable' in kv_events (did you mean 'enabled'?)"));
}

TEST(TopologyParse, RoutingSection) {
  Topology defaults;
  ASSERT_TRUE(parse("", &defaults).is_ok());
  EXPECT_FALSE(defaults.routing.pass_through_unknown);

  Topology t;
  Status s = parse("routing:\n  pass_through_unknown: true\n", &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.routing.pass_through_unknown);
  EXPECT_THAT(error_of("routing:\n  pass_through: true\n", StatusCode::kInvalidValue),
              HasSubstr("unknown key 'pass_through' in routing"));
  EXPECT_TRUE(defaults.routing.pass_through_paths.empty());
}

TEST(TopologyParse, PassThroughPathsAreNormalisedPaths) {
  Topology t;
  Status s = parse("routing:\n  pass_through_paths: [\"/v1/extra\", \"/v2/**\", \"/\"]\n", &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.routing.pass_through_paths, (std::vector<std::string>{"/v1/extra", "/v2/**", "/"}));
  // Entries are compared with decoded, normalised request paths: other spellings never match.
  for (const char* bad : {"v1/x", "/v1/x/", "/v1//x", "/v1/./x", "/v1/../x", "/v1%2Fx", "/v1/x?y", "/v1/*", "/a b"}) {
    EXPECT_THAT(error_of(std::string("routing:\n  pass_through_paths: [\"") + bad + "\"]\n",
                         StatusCode::kInvalidValue),
                HasSubstr("routing.pass_through_paths[0]: expected a decoded path"))
        << bad;
  }
  EXPECT_THAT(error_of("routing:\n  pass_through_paths: /v1/x\n", StatusCode::kWrongType),
              HasSubstr("expected a list of paths"));
}

TEST(TopologyParse, UnknownPolicyListsChoices) {
  EXPECT_EQ(error_of("workers: 2\npolicies:\n  decode: fastest\n", StatusCode::kInvalidValue),
            "topo.yaml:3:11: policies.decode: unknown policy 'fastest' (expected round_robin, "
            "least_outstanding, power_of_two, affinity, cache_aware, predicted_latency)");
}

TEST(TopologyParse, PredictedLatencySection) {
  Topology t;
  Status s = parse(
      "policies:\n"
      "  prefill: predicted_latency\n"
      "  decode: predicted_latency\n"
      "  predicted_latency: {default_prefill_tokens_per_second: 12000, default_decode_step_us: 9000,\n"
      "                      decode_step_us_per_sequence: 20, decode_step_ns_per_kv_token: 50,\n"
      "                      kv_transfer_ns_per_token: 1000, kv_capacity_tokens: 100000,\n"
      "                      kv_full_penalty_ms: 500, slo_ttft_ms: 2000, slo_tpot_ms: 80, shed: true,\n"
      "                      fleet_work_weight: 0, prefill_rate: node, step_token_budget: 2048}\n",
      &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.policies.prefill, PolicyName::kPredictedLatency);
  EXPECT_EQ(t.policies.decode, PolicyName::kPredictedLatency);
  const auto& pl = t.policies.predicted_latency;
  EXPECT_EQ(pl.default_prefill_tokens_per_second, 12000u);
  EXPECT_EQ(pl.default_decode_step_us, 9000u);
  EXPECT_EQ(pl.decode_step_us_per_sequence, 20u);
  EXPECT_EQ(pl.decode_step_ns_per_kv_token, 50u);
  EXPECT_EQ(pl.kv_transfer_ns_per_token, 1000u);
  EXPECT_EQ(pl.kv_capacity_tokens, 100000u);
  EXPECT_EQ(pl.kv_full_penalty_ms, 500u);
  EXPECT_EQ(pl.slo_ttft_ms, 2000u);
  EXPECT_EQ(pl.slo_tpot_ms, 80u);
  EXPECT_TRUE(pl.shed);
  EXPECT_EQ(pl.fleet_work_weight, 0u);
  EXPECT_TRUE(pl.prefill_rate_per_node);
  EXPECT_EQ(pl.step_token_budget, 2048u);
  ASSERT_TRUE(parse("policies: {prefill: predicted_latency}\n", &t).is_ok());
  EXPECT_EQ(t.policies.predicted_latency, Topology::Policies::PredictedLatency{});
  EXPECT_THAT(error_of("policies:\n  predicted_latency: {default_prefill_tokens_per_second: 0}\n",
                       StatusCode::kOutOfRange),
              HasSubstr("default_prefill_tokens_per_second"));
  EXPECT_THAT(error_of("policies:\n  predicted_latency: {slo_tpot_ms: 60001}\n", StatusCode::kOutOfRange),
              HasSubstr("slo_tpot_ms"));
  EXPECT_THAT(error_of("policies:\n  predicted_latency: {fleet_work_weight: 1001}\n", StatusCode::kOutOfRange),
              HasSubstr("fleet_work_weight"));
  EXPECT_THAT(error_of("policies:\n  predicted_latency: {step_token_budget: 0}\n", StatusCode::kOutOfRange),
              HasSubstr("step_token_budget"));
  EXPECT_THAT(error_of("policies:\n  predicted_latency: {prefill_rate: gpu}\n", StatusCode::kInvalidValue),
              HasSubstr("unknown prefill_rate 'gpu' (expected fleet or node)"));
  EXPECT_THAT(error_of("policies:\n  predicted_latency: {slo_ttft: 5}\n", StatusCode::kInvalidValue),
              HasSubstr("unknown key 'slo_ttft'"));
}

TEST(TopologyParse, UnknownKeysAreErrors) {
  EXPECT_EQ(error_of("workers: 1\nlistner:\n  http: x\n", StatusCode::kInvalidValue),
            "topo.yaml:2:1: unknown key 'listner' at top level (did you mean 'listeners'?)");
  EXPECT_EQ(error_of("discovery:\n  tll_ms: 5\n", StatusCode::kInvalidValue),
            "topo.yaml:2:3: unknown key 'tll_ms' in discovery (did you mean 'ttl_ms'?)");
  EXPECT_THAT(
      error_of("instances:\n  - role: decode\n    http_address: a:1\n    connector: nixl\n    "
               "colour: red\n",
               StatusCode::kInvalidValue),
      Eq("topo.yaml:5:5: unknown key 'colour' in instances[0] (expected one of: role, "
         "http_address, connector, transfer_mode, zmq_address, dp_size, tp_size, pp_size, engine_id, "
         "bootstrap_port, kv_events_endpoint, kv_events_replay_endpoint, model, labels, tls)"));
  EXPECT_THAT(error_of("workers: 1\nworkers: 2\n", StatusCode::kInvalidValue),
              StartsWith("topo.yaml:2:1: workers: duplicate key"));
}

TEST(TopologyParse, WrongTypesAreNamed) {
  EXPECT_EQ(error_of("workers: many\n", StatusCode::kWrongType),
            "topo.yaml:1:10: workers: expected an integer, got 'many'");
  EXPECT_EQ(
      error_of("timeouts:\n  connect_ms: \"100\"\n", StatusCode::kWrongType),
      "topo.yaml:2:15: timeouts.connect_ms: expected an integer number of milliseconds, got the "
      "string '100'");
  EXPECT_EQ(
      error_of("timeouts:\n  connect_ms: 1.5\n", StatusCode::kWrongType),
      "topo.yaml:2:15: timeouts.connect_ms: expected an integer number of milliseconds, got '1.5'");
  EXPECT_EQ(error_of("instances: {role: prefill}\n", StatusCode::kWrongType),
            "topo.yaml:1:12: instances: expected a list of instances, got a map");
  EXPECT_EQ(error_of("timeouts: [1, 2]\n", StatusCode::kWrongType),
            "topo.yaml:1:11: timeouts: expected a map, got a list");
  EXPECT_EQ(
      error_of("discovery:\n  allow_unauthenticated_vllm: yes\n", StatusCode::kWrongType),
      "topo.yaml:2:31: discovery.allow_unauthenticated_vllm: expected true or false, got 'yes'");
  EXPECT_EQ(error_of("policies:\n  affinity_header:\n", StatusCode::kWrongType),
            "topo.yaml:2:3: policies.affinity_header: expected a string, got null (write \"\" for "
            "empty)");
  EXPECT_EQ(error_of("- workers\n", StatusCode::kWrongType),
            "topo.yaml:1:1: top level must be a map, got a list");
  // Parsed strings (addresses, names) carry the position once.
  EXPECT_EQ(error_of("instances:\n  - role: [a]\n    http_address: \"a:1\"\n", StatusCode::kWrongType)
                .rfind("topo.yaml:"),
            0u);
  EXPECT_EQ(error_of("listeners:\n  http: {a: 1}\n", StatusCode::kWrongType).rfind("topo.yaml:"), 0u);
}

TEST(TopologyParse, NegativeNumbersAreRejected) {
  EXPECT_EQ(error_of("retries:\n  prefill_attempts: -1\n", StatusCode::kOutOfRange),
            "topo.yaml:2:21: retries.prefill_attempts: negative numbers are not allowed (got -1; "
            "expected 1..16)");
  EXPECT_THAT(
      error_of("limits: {max_connections: 99999999999999999999999}\n", StatusCode::kOutOfRange),
      HasSubstr("limits.max_connections: 99999999999999999999999 is out of range"));
}

TEST(TopologyParse, RequestBoundsAreRangeChecked) {
  EXPECT_THAT(error_of("timeouts: {client_write_ms: 0}\n", StatusCode::kOutOfRange),
              HasSubstr("timeouts.client_write_ms: 0 is out of range"));
  EXPECT_THAT(error_of("timeouts: {request_ms: 86400001}\n", StatusCode::kOutOfRange),
              HasSubstr("timeouts.request_ms: 86400001 is out of range"));
  EXPECT_THAT(error_of("limits: {max_buffered_bytes: 4294967296}\n", StatusCode::kOutOfRange),
              HasSubstr("limits.max_buffered_bytes: 4294967296 is out of range"));
  Topology t;
  ASSERT_TRUE(parse("timeouts: {request_ms: 0}\nlimits: {max_buffered_bytes: 0}\n", &t).is_ok());
  EXPECT_EQ(t.timeouts.request, 0ms);
  EXPECT_EQ(t.limits.max_buffered_bytes, 0u);
}

TEST(TopologyParse, OrphanBounds) {
  Topology defaults;
  ASSERT_TRUE(parse("", &defaults).is_ok());
  EXPECT_EQ(defaults.timeouts.orphan_grace, 5000ms);
  EXPECT_EQ(defaults.limits.max_orphan_legs_per_node, 64u);
  Topology t;
  ASSERT_TRUE(parse("timeouts: {orphan_grace_ms: 0}\nlimits: {max_orphan_legs_per_node: 0}\n", &t).is_ok());
  EXPECT_EQ(t.timeouts.orphan_grace, 0ms);
  EXPECT_EQ(t.limits.max_orphan_legs_per_node, 0u);
  ASSERT_TRUE(parse("timeouts: {orphan_grace_ms: 250}\nlimits: {max_orphan_legs_per_node: 8}\n", &t).is_ok());
  EXPECT_EQ(t.timeouts.orphan_grace, 250ms);
  EXPECT_EQ(t.limits.max_orphan_legs_per_node, 8u);
  EXPECT_THAT(error_of("timeouts: {orphan_grace_ms: 86400001}\n", StatusCode::kOutOfRange),
              HasSubstr("timeouts.orphan_grace_ms: 86400001 is out of range"));
  EXPECT_THAT(error_of("limits: {max_orphan_legs_per_node: 1000001}\n", StatusCode::kOutOfRange),
              HasSubstr("limits.max_orphan_legs_per_node: 1000001 is out of range"));
}

TEST(TopologyParse, CrossFieldChecks) {
  EXPECT_THAT(error_of("retries:\n  decode_attempts: 0\n", StatusCode::kOutOfRange),
              HasSubstr("retries.decode_attempts: 0 is out of range (1..16)"));
  EXPECT_THAT(error_of("workers: 257\n", StatusCode::kOutOfRange),
              HasSubstr("workers: 257 is out of range (0..256)"));
  EXPECT_EQ(error_of("discovery:\n  ttl_ms: 500\n", StatusCode::kOutOfRange),
            "topo.yaml:2:11: discovery.ttl_ms: need min_ttl_ms <= ttl_ms <= max_ttl_ms, got 1000 "
            "<= 500 <= "
            "300000");
  EXPECT_THAT(
      error_of("discovery:\n  min_ttl_ms: 9000\n  max_ttl_ms: 8000\n", StatusCode::kOutOfRange),
      StartsWith("topo.yaml:2:15: discovery.min_ttl_ms: need min_ttl_ms <= ttl_ms"));
  Topology t;
  EXPECT_TRUE(parse("discovery: {ttl_ms: 1000, min_ttl_ms: 1000, max_ttl_ms: 1000}\n", &t).is_ok());
}

TEST(TopologyParse, StaticInstanceRules) {
  EXPECT_THAT(error_of("instances:\n  - http_address: a:1\n", StatusCode::kMissingKey),
              StartsWith("topo.yaml:2:5: instances[0]: missing key 'role'"));
  EXPECT_THAT(
      error_of("instances:\n  - {role: prefill, http_address: a:1}\n", StatusCode::kMissingKey),
      HasSubstr("instances[0]: connector moriio needs zmq_address"));
  EXPECT_THAT(error_of("instances:\n  - {role: prefill, http_address: a:1, zmq_address: \"a:1\"}\n",
                       StatusCode::kBadAddress),
              StartsWith("topo.yaml:2:53: instances[0].zmq_address: "));
  EXPECT_THAT(error_of("instances:\n  - {role: decode, http_address: a:1, connector: p2p-nccl, "
                       "zmq_address: \"host:a,handshake:1,notify:2\"}\n",
                       StatusCode::kBadAddress),
              HasSubstr("instances[0].zmq_address: "));
  EXPECT_THAT(
      error_of("instances:\n  - {role: decode, http_address: a:1, zmq_address: "
               "\"host:a,handshake:1,notify:2\", transfer_mode: none}\n",
               StatusCode::kInvalidValue),
      HasSubstr("instances[0].transfer_mode: connector moriio needs transfer_mode READ or WRITE"));
  EXPECT_THAT(error_of("instances:\n  - {role: X, http_address: a:1}\n", StatusCode::kInvalidValue),
              HasSubstr("instances[0].role: unknown role 'X' (expected prefill or decode)"));
  EXPECT_THAT(error_of("instances:\n  - {role: decode, http_address: a:1, connector: warp}\n",
                       StatusCode::kInvalidValue),
              HasSubstr("instances[0].connector: unknown connector 'warp'"));
  EXPECT_THAT(
      error_of("instances:\n  - {role: decode, http_address: a:1, connector: nixl, tp_size: 0}\n",
               StatusCode::kOutOfRange),
      HasSubstr("instances[0].tp_size: 0 is out of range (1..1024)"));
  EXPECT_THAT(
      error_of("instances:\n  - {role: decode, http_address: a:1, connector: nixl, labels: [a]}\n",
               StatusCode::kWrongType),
      HasSubstr("instances[0].labels: expected a map of labels, got a list"));
  EXPECT_THAT(
      error_of(
          "instances:\n  - {role: decode, http_address: a:1, connector: nixl, labels: {a: [1]}}\n",
          StatusCode::kWrongType),
      HasSubstr("instances[0].labels.a: expected a string, got a list"));
}

TEST(TopologyParse, DuplicateInstanceAddress) {
  const std::string text =
      "connectors: {default: nixl}\n"
      "instances:\n"
      "  - {role: prefill, http_address: \"127.0.10.1:8000\"}\n"
      "  - {role: decode, http_address: \"127.0.10.2:8000\"}\n"
      "  - {role: decode, http_address: \"127.0.10.1:8000\"}\n";
  EXPECT_EQ(error_of(text, StatusCode::kInvalidValue),
            "topo.yaml:5:34: instances[2].http_address: duplicate instance 127.0.10.1:8000 (also "
            "instances[0])");
}

TEST(TopologyParse, EnvSecretMustExist) {
  ::unsetenv("PDR_TEST_NOT_SET_ANYWHERE");
  EXPECT_EQ(
      error_of("discovery:\n  auth_token_env: PDR_TEST_NOT_SET_ANYWHERE\n", StatusCode::kNotFound),
      "topo.yaml:2:19: discovery.auth_token_env: environment variable 'PDR_TEST_NOT_SET_ANYWHERE' "
      "is "
      "not set or empty");
  ScopedEnv empty("PDR_TEST_EMPTY_SECRET", "");
  EXPECT_THAT(error_of("admin: {api_key_env: PDR_TEST_EMPTY_SECRET}\n", StatusCode::kNotFound),
              HasSubstr("'PDR_TEST_EMPTY_SECRET' is not set or empty"));
  ScopedEnv multiline("PDR_TEST_BAD_SECRET", "hunter2\nX-Injected: 1");
  std::string msg = error_of("connectors: {upstream_api_key_env: PDR_TEST_BAD_SECRET}\n",
                             StatusCode::kInvalidValue);
  EXPECT_THAT(msg, HasSubstr("'PDR_TEST_BAD_SECRET' contains control characters"));
  EXPECT_THAT(msg, Not(HasSubstr("hunter2")));
  EXPECT_THAT(error_of("admin: {api_key_env: \"1BAD-NAME\"}\n", StatusCode::kInvalidValue),
              HasSubstr("admin.api_key_env: '1BAD-NAME' is not an environment variable name"));
}

TEST(TopologyParse, SecretFile) {
  TempDir dir;
  const std::string key_path = dir.write("admin.key", "s3cret-value\n");
  Topology t;
  Status s = parse("admin:\n  api_key_file: " + key_path + "\n", &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.admin.api_key, "s3cret-value");
  EXPECT_EQ(t.admin.api_key_file, key_path);

  // Relative to the topology file.
  const std::string topo_path = dir.write("topo.yaml", "admin:\n  api_key_file: admin.key\n");
  s = load_topology_file(topo_path, &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.admin.api_key, "s3cret-value");

  std::string msg =
      error_of("admin:\n  api_key_file: " + dir.file("missing.key") + "\n", StatusCode::kIoError);
  EXPECT_THAT(msg, StartsWith("topo.yaml:2:17: admin.api_key_file: '" + dir.file("missing.key") +
                              "': cannot open"));

  const std::string big = dir.write("big.key", std::string(5000, 'k'));
  EXPECT_THAT(error_of("admin:\n  api_key_file: " + big + "\n", StatusCode::kTooLarge),
              HasSubstr("file is larger than 4096 bytes"));
  const std::string two_lines = dir.write("two.key", "hunter2\nsecond\n");
  msg = error_of("admin:\n  api_key_file: " + two_lines + "\n", StatusCode::kInvalidValue);
  EXPECT_THAT(msg, Not(HasSubstr("hunter2")));

  ScopedEnv admin("PDR_TEST_ADMIN_KEY2", "x");
  EXPECT_THAT(
      error_of("admin:\n  api_key_env: PDR_TEST_ADMIN_KEY2\n  api_key_file: " + key_path + "\n",
               StatusCode::kInvalidValue),
      HasSubstr("set api_key_env or api_key_file, not both"));
}

TEST(TopologyParse, YamlBombIsRejectedFast) {
  const std::string bomb =
      "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
      "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
      "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
      "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
      "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
      "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
      "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
      "h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
      "i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n";
  auto start = std::chrono::steady_clock::now();
  std::string msg = error_of(bomb, StatusCode::kTooLarge);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_THAT(msg, HasSubstr("document has more than 10000 nodes"));

  std::string flat = "instances: [";
  while (flat.size() < 1000000) flat += "1,";
  flat += "1]\n";
  start = std::chrono::steady_clock::now();
  EXPECT_EQ(
      error_of(flat, StatusCode::kTooLarge),
      "topo.yaml:1:20007: document has more than 10000 nodes (aliases count each time they are "
      "used)");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);

  std::string deep = "workers: ";
  for (int i = 0; i < 20; ++i) deep += "[";
  for (int i = 0; i < 20; ++i) deep += "]";
  EXPECT_THAT(error_of(deep, StatusCode::kTooDeep), HasSubstr("nesting is deeper than 16 levels"));

  // Aliases within the budget are fine.
  Topology t;
  Status s = parse(
      "connectors: &c {default: nixl}\ninstances:\n  - {role: decode, http_address: a:1, labels: "
      "&l {x: y}}\n"
      "  - {role: prefill, http_address: b:1, labels: *l}\n",
      &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.static_instances[1].labels, (proto::Labels{{"x", "y"}}));
}

TEST(TopologyParse, OneDocumentOnly) {
  EXPECT_EQ(error_of("workers: 1\n---\nworkers: 2\n", StatusCode::kInvalidValue),
            "topo.yaml:3:1: more than one YAML document (only one topology per file)");
}

TEST(TopologyParse, OutputUntouchedOnError) {
  Topology t;
  t.workers = 7;
  t.source_path = "marker";
  EXPECT_FALSE(parse("workers: 3\nretries: {prefill_attempts: 0}\n", &t).is_ok());
  EXPECT_EQ(t.workers, 7u);
  EXPECT_EQ(t.source_path, "marker");
}

TEST(TopologyParse, FileLimits) {
  TempDir dir;
  Topology t;
  Status s = load_topology_file(dir.file("absent.yaml"), &t);
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_THAT(s.message(), StartsWith(dir.file("absent.yaml") + ": cannot open"));
  const std::string big = dir.write("big.yaml", "# " + std::string(1 << 20, 'x') + "\n");
  EXPECT_EQ(load_topology_file(big, &t).code(), StatusCode::kTooLarge);
  EXPECT_EQ(load_topology_file(dir.file(""), &t).code(), StatusCode::kIoError);  // a directory
}

TEST(TopologyParse, DiscoveryAdmissionDefaultsAdmitThisMachineOnly) {
  Topology t;
  ASSERT_TRUE(parse("", &t).is_ok());
  EXPECT_EQ(t.listeners.discovery, "tcp://*:36367");
  EXPECT_TRUE(t.listeners.discovery_curve.empty());
  ASSERT_EQ(t.discovery.allowed_peers.cidrs.size(), 2u);
  EXPECT_EQ(t.discovery.allowed_peers.cidrs[0].to_string(), "127.0.0.0/8");
  EXPECT_EQ(t.discovery.allowed_peers.cidrs[1].to_string(), "::1/128");
  EXPECT_FALSE(t.discovery.allow_open);
  EXPECT_FALSE(t.discovery.open_to_network(t.listeners.discovery, t.listeners.discovery_curve));
  EXPECT_EQ(t.discovery.max_instances_per_class[static_cast<size_t>(AdmissionClass::kOpen)], 256u);
}

TEST(TopologyParse, DiscoveryAdmissionKeys) {
  Topology t;
  ASSERT_TRUE(parse("discovery:\n"
                    "  allowed_peers: [\"127.0.0.0/24\", \"::1\"]\n"
                    "  max_instances_per_class: {open: 0, address: 100, curve: 5000}\n",
                    &t)
                  .is_ok());
  ASSERT_EQ(t.discovery.allowed_peers.cidrs.size(), 2u);
  EXPECT_EQ(t.discovery.allowed_peers.cidrs[1].to_string(), "::1/128");
  EXPECT_EQ(t.discovery.max_instances_per_class[0], 0u);
  EXPECT_EQ(t.discovery.max_instances_per_class[1], 100u);
  EXPECT_EQ(t.discovery.max_instances_per_class[2], 4096u);
  EXPECT_EQ(t.discovery.max_instances_per_class[3], 5000u);
  ASSERT_TRUE(parse("discovery: {max_instances: 20000}\n", &t).is_ok());
  EXPECT_EQ(t.discovery.max_instances_per_class[0], 256u);  // open
  EXPECT_EQ(t.discovery.max_instances_per_class[1], 20000u);
  EXPECT_EQ(t.discovery.max_instances_per_class[3], 20000u);
  EXPECT_THAT(error_of("discovery: {allowed_peers: [\"127.1.2.3/8\"]}\n", StatusCode::kInvalidValue),
              HasSubstr("did you mean 127.0.0.0/8"));
  EXPECT_THAT(error_of("discovery: {allowed_peers: \"127.0.0.1\"}\n", StatusCode::kWrongType),
              HasSubstr("expected a list of CIDRs"));
  EXPECT_THAT(error_of("discovery: {max_instances_per_class: {opne: 1}}\n", StatusCode::kInvalidValue),
              HasSubstr("open"));
}

TEST(TopologyParse, DiscoveryOpenToTheNetworkNeedsAnOptIn) {
  const std::string open = "discovery:\n  allowed_peers: [\"0.0.0.0/0\", \"::/0\"]\n";
  EXPECT_THAT(error_of(open, StatusCode::kInvalidValue), HasSubstr("discovery.allow_open: true"));
  Topology t;
  ASSERT_TRUE(parse(open + "  allow_open: true\n", &t).is_ok());
  EXPECT_TRUE(t.discovery.open_to_network(t.listeners.discovery, t.listeners.discovery_curve));
  // Bound to loopback, an allow-everything list reaches nobody else: no opt-in needed.
  ASSERT_TRUE(parse("listeners: {discovery: \"tcp://127.0.0.1:0\"}\n" + open, &t).is_ok());
  EXPECT_FALSE(t.discovery.open_to_network(t.listeners.discovery, t.listeners.discovery_curve));
  EXPECT_TRUE(endpoint_is_local("ipc:///tmp/pdr.sock"));
  EXPECT_TRUE(endpoint_is_local("tcp://localhost:5"));
  EXPECT_FALSE(endpoint_is_local("tcp://*:5"));
}

TEST(TopologyParse, DiscoveryCurveKeysFromFiles) {
  TempDir dir;
  proto::CurveKeyPair server, client;
  ASSERT_TRUE(proto::generate_curve_key_pair(&server).is_ok());
  ASSERT_TRUE(proto::generate_curve_key_pair(&client).is_ok());
  dir.write("router.key", proto::curve_certificate(server, true));
  dir.write("clients.txt", "# sidecars\n" + client.public_z85 + "\n");
  dir.write("empty.txt", "# nobody yet\n");
  const std::string topo = dir.write("topo.yaml",
                                     "listeners: {discovery_curve: \"tcp://*:36368\"}\n"
                                     "discovery:\n"
                                     "  curve: {secret_key_file: router.key, allowed_client_keys_file: clients.txt}\n");
  Topology t;
  ASSERT_TRUE(load_topology_file(topo, &t).is_ok());
  EXPECT_EQ(t.listeners.discovery_curve, "tcp://*:36368");
  EXPECT_EQ(t.discovery.curve.server_keys.public_z85, server.public_z85);
  EXPECT_EQ(t.discovery.curve.allowed_client_keys, std::vector<std::string>{client.public_z85});
  // With a key list, the CURVE endpoint does not open discovery to the network.
  EXPECT_FALSE(t.discovery.open_to_network(t.listeners.discovery, t.listeners.discovery_curve));

  Status s = parse("listeners: {discovery_curve: \"tcp://*:36368\"}\n", &t);
  EXPECT_THAT(s.message(), HasSubstr("needs discovery.curve.secret_key_file"));
  s = load_topology_file(dir.write("t2.yaml", "discovery: {curve: {allowed_client_keys_file: empty.txt}}\n"), &t);
  EXPECT_THAT(s.message(), HasSubstr("holds no key"));
  s = load_topology_file(dir.write("t3.yaml", "discovery: {curve: {secret_key_file: empty.txt}}\n"), &t);
  EXPECT_THAT(s.message(), HasSubstr("no CURVE key"));
  // The secret never appears in an error message.
  dir.write("bad.key", "curve\n    secret-key = \"" + server.secret_z85.substr(0, 39) + "~\"\n");
  s = load_topology_file(dir.write("t4.yaml", "discovery: {curve: {secret_key_file: bad.key}}\n"), &t);
  EXPECT_FALSE(s.is_ok());
  EXPECT_THAT(s.message(), Not(HasSubstr(server.secret_z85.substr(0, 39))));
}

TEST(TopologyParse, PolicyNamesRoundTrip) {
  for (PolicyName p : {PolicyName::kRoundRobin, PolicyName::kLeastOutstanding,
                       PolicyName::kPowerOfTwo, PolicyName::kAffinity, PolicyName::kCacheAware}) {
    PolicyName back = PolicyName::kRoundRobin;
    ASSERT_TRUE(parse_policy_name(to_string(p), &back));
    EXPECT_EQ(back, p);
  }
  PolicyName unused;
  EXPECT_FALSE(parse_policy_name("fastest", &unused));
}

TEST(RestartRequiredChanges, ListsListenersAndWorkersOnly) {
  Topology a;
  Topology b;
  b.timeouts.connect = 1ms;
  b.static_instances.push_back(StaticInstance{});
  EXPECT_TRUE(restart_required_changes(a, b).empty());
  b.listeners.http.port = 9000;
  b.workers = 3;
  EXPECT_THAT(
      restart_required_changes(a, b),
      ::testing::ElementsAre("listeners.http: 0.0.0.0:10001 -> 0.0.0.0:9000", "workers: 0 -> 3"));
  b = a;
  b.listeners.admin = proto::HostPort{"127.0.0.1", 9100};
  EXPECT_THAT(restart_required_changes(a, b),
              ::testing::ElementsAre("listeners.admin: (unset) -> 127.0.0.1:9100"));
  b = a;
  b.kv_events.enabled = true;
  b.kv_events.default_port = 5557;
  b.kv_events.topic = "kv@";
  b.kv_events.max_index_entries = 10;
  b.kv_events.max_node_batches_per_sec = 5;
  b.kv_events.max_node_bytes_per_sec = 65536;
  b.kv_events.max_ranks_per_node = 2;
  b.kv_events.max_subscriptions = 3;
  EXPECT_THAT(restart_required_changes(a, b),
              ::testing::ElementsAre("kv_events.enabled: false -> true",
                                     "kv_events.default_port: (unset) -> 5557",
                                     "kv_events.topic: '' -> 'kv@'",
                                     "kv_events.max_index_entries: 4000000 -> 10",
                                     "kv_events.max_node_batches_per_sec: 10000 -> 5",
                                     "kv_events.max_node_bytes_per_sec: 8388608 -> 65536",
                                     "kv_events.max_ranks_per_node: 64 -> 2",
                                     "kv_events.max_subscriptions: 1024 -> 3"));
  b = a;
  b.policies.cache_aware.prefix_tree_max_bytes = 1 << 20;
  b.policies.cache_aware.min_match_percent = 80;  // applies live
  EXPECT_THAT(restart_required_changes(a, b),
              ::testing::ElementsAre("policies.cache_aware.prefix_tree_max_bytes: 67108864 -> 1048576"));
}

TEST(TopologyParse, ConditionalDisaggregation) {
  Topology t;
  EXPECT_FALSE(t.conditional_disaggregation.enabled);
  EXPECT_EQ(t.conditional_disaggregation.prefill_busy_ms, 0u);
  ASSERT_TRUE(parse("conditional_disaggregation: {enabled: true, max_prompt_tokens: 64, min_cached_percent: 95,\n"
                    "                             prefill_busy_ms: 1500}\n",
                    &t)
                  .is_ok());
  EXPECT_TRUE(t.conditional_disaggregation.enabled);
  EXPECT_EQ(t.conditional_disaggregation.max_prompt_tokens, 64u);
  EXPECT_EQ(t.conditional_disaggregation.min_cached_percent, 95u);
  EXPECT_EQ(t.conditional_disaggregation.prefill_busy_ms, 1500u);
  EXPECT_THAT(error_of("conditional_disaggregation: {prefill_busy_ms: 3600001}\n", StatusCode::kOutOfRange),
              HasSubstr("prefill_busy_ms"));
  Topology untouched;
  Status s = parse("conditional_disaggregation: {min_cached_percent: 101}\n", &untouched);
  EXPECT_FALSE(s.is_ok());
  EXPECT_THAT(s.message(), HasSubstr("min_cached_percent"));
}

TEST(TopologyParse, SessionAffinity) {
  Topology t;
  EXPECT_FALSE(t.session_affinity.enabled);
  EXPECT_EQ(t.session_affinity.headers,
            (std::vector<std::string>{"x-session-affinity", "session-id", "x-claude-code-session-id"}));
  EXPECT_EQ(t.session_affinity.fields, (std::vector<std::string>{"conversation_id", "user"}));
  Status s = parse(
      "session_affinity: {enabled: true, headers: [X-Session-Affinity, session-id], fields: [conversation_id, user],\n"
      "  max_sessions: 1000, idle_ttl_ms: 60000, max_id_bytes: 64, spill_margin_requests: 2,\n"
      "  spill_margin_queue_ms: 500}\n",
      &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.session_affinity.enabled);
  EXPECT_EQ(t.session_affinity.headers, (std::vector<std::string>{"x-session-affinity", "session-id"}));
  EXPECT_EQ(t.session_affinity.fields, (std::vector<std::string>{"conversation_id", "user"}));
  EXPECT_EQ(t.session_affinity.max_sessions, 1000u);
  EXPECT_EQ(t.session_affinity.idle_ttl, 60000ms);
  EXPECT_EQ(t.session_affinity.max_id_bytes, 64u);
  EXPECT_EQ(t.session_affinity.spill_margin_requests, 2u);
  EXPECT_EQ(t.session_affinity.spill_margin_queue, 500ms);
  for (const char* bad : {"session_affinity: {max_sessions: 0}\n", "session_affinity: {idle_ttl_ms: 10}\n",
                          "session_affinity: {max_id_bytes: 5000}\n", "session_affinity: {headers: [\"a b\"]}\n",
                          "session_affinity: {fields: [\"a\\\\b\"]}\n", "session_affinity: {headers: [a, A]}\n",
                          "session_affinity: {headers: [a, b, c, d, e, f, g, h, i]}\n",
                          "session_affinity: {enabled: true, headers: [], fields: []}\n",
                          "session_affinity: {headers: x-session}\n"}) {
    Topology untouched;
    EXPECT_FALSE(parse(bad, &untouched).is_ok()) << bad;
  }
}

TEST(TopologyParse, MultiTurn) {
  Topology t;
  EXPECT_FALSE(t.multi_turn.enabled);
  EXPECT_EQ(t.multi_turn.ttl, 450000ms);
  Status s = parse("multi_turn: {enabled: true, ttl_ms: 300000, max_entries: 10, max_bytes: 1048576}\n", &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.multi_turn.enabled);
  EXPECT_EQ(t.multi_turn.ttl, 300000ms);
  EXPECT_EQ(t.multi_turn.max_entries, 10u);
  EXPECT_EQ(t.multi_turn.max_bytes, 1048576u);
  Topology untouched;
  s = parse("multi_turn: {ttl_ms: 10}\n", &untouched);
  EXPECT_FALSE(s.is_ok());
  EXPECT_THAT(s.message(), HasSubstr("ttl_ms"));
  s = parse("multi_turn: {enable: true}\n", &untouched);
  EXPECT_FALSE(s.is_ok());
  EXPECT_THAT(s.message(), HasSubstr("did you mean 'enabled'"));
}

TEST(TopologyParse, MultiTurnBindsEntriesToTheClientsCredential) {
  using BindTo = Topology::MultiTurn::BindTo;
  Topology t;
  EXPECT_EQ(t.multi_turn.bind_to, BindTo::kAuthorization);
  EXPECT_TRUE(t.multi_turn.allow_anonymous);
  EXPECT_EQ(t.multi_turn.binding_secret, "");
  ScopedEnv secret("PDR_TEST_BINDING_SECRET", "s3cret");
  Status s = parse("multi_turn: {bind_to: 'header:X-Tenant-Id', allow_anonymous: false, "
                   "binding_secret_env: PDR_TEST_BINDING_SECRET}\n",
                   &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.multi_turn.bind_to, BindTo::kHeader);
  EXPECT_EQ(t.multi_turn.bind_header, "x-tenant-id");
  EXPECT_FALSE(t.multi_turn.allow_anonymous);
  EXPECT_EQ(t.multi_turn.binding_secret, "s3cret");
  EXPECT_EQ(t.multi_turn.binding_secret_env, "PDR_TEST_BINDING_SECRET");
  ASSERT_TRUE(parse("multi_turn: {bind_to: none}\n", &t).is_ok());
  EXPECT_EQ(t.multi_turn.bind_to, BindTo::kNone);
  ASSERT_TRUE(parse("multi_turn: {bind_to: authorization}\n", &t).is_ok());
  EXPECT_EQ(t.multi_turn.bind_to, BindTo::kAuthorization);
  for (const char* bad : {"multi_turn: {bind_to: header}\n", "multi_turn: {bind_to: 'header:'}\n",
                          "multi_turn: {bind_to: 'header:x tenant'}\n", "multi_turn: {bind_to: address}\n",
                          "multi_turn: {bind_to: none, allow_anonymous: false}\n",
                          "multi_turn: {binding_secret_env: PDR_TEST_NOT_SET_ANYWHERE}\n"}) {
    Topology untouched;
    s = parse(bad, &untouched);
    EXPECT_FALSE(s.is_ok()) << bad;
    EXPECT_EQ(untouched.multi_turn.bind_to, BindTo::kAuthorization) << bad;
  }
  s = parse("multi_turn: {bind_to: 'header:x tenant'}\n", &t);
  EXPECT_THAT(s.message(), HasSubstr("header:<header name>"));
}

TEST(TopologyParse, CacheAwarePolicyAndItsThresholds) {
  Topology t;
  Status s = parse(
      "policies:\n"
      "  prefill: cache_aware\n"
      "  decode: cache_aware\n"
      "  cache_aware: {min_match_percent: 70, balance_abs_threshold: 4, balance_rel_percent: 300,\n"
      "                prefix_tree_max_bytes: 1048576, prefix_tree_prompt_bytes: 4096}\n",
      &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.policies.prefill, PolicyName::kCacheAware);
  EXPECT_EQ(t.policies.decode, PolicyName::kCacheAware);
  EXPECT_EQ(t.policies.cache_aware.min_match_percent, 70u);
  EXPECT_EQ(t.policies.cache_aware.balance_abs_threshold, 4u);
  EXPECT_EQ(t.policies.cache_aware.balance_rel_percent, 300u);
  EXPECT_EQ(t.policies.cache_aware.prefix_tree_max_bytes, 1048576u);
  EXPECT_EQ(t.policies.cache_aware.prefix_tree_prompt_bytes, 4096u);
  // Defaults.
  ASSERT_TRUE(parse("policies: {prefill: cache_aware}\n", &t).is_ok());
  EXPECT_EQ(t.policies.cache_aware, Topology::Policies::CacheAware{});
  // Out of range and misspelt keys are refused with where and why.
  Topology untouched;
  s = parse("policies: {cache_aware: {min_match_percent: 0}}\n", &untouched);
  EXPECT_FALSE(s.is_ok());
  EXPECT_THAT(s.message(), HasSubstr("min_match_percent"));
  s = parse("policies: {cache_aware: {balance_rel_percent: 50}}\n", &untouched);
  EXPECT_FALSE(s.is_ok());
  s = parse("policies: {cache_aware: {min_match: 50}}\n", &untouched);
  EXPECT_FALSE(s.is_ok());
  EXPECT_THAT(s.message(), HasSubstr("unknown key 'min_match' in policies.cache_aware"));
  s = parse("policies: {prefill: cache-aware}\n", &untouched);
  EXPECT_FALSE(s.is_ok());
  EXPECT_THAT(s.message(), HasSubstr("cache_aware"));
}

TEST(TopologyParse, CacheAwareTokenizeByNode) {
  Topology t;
  EXPECT_FALSE(Topology{}.policies.cache_aware.tokenize_by_node);  // off by default: it costs a hop
  Status s = parse(
      "policies:\n"
      "  cache_aware: {tokenize: node, tokenize_timeout_ms: 80, tokenize_max_answer_bytes: 65536}\n",
      &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.policies.cache_aware.tokenize_by_node);
  EXPECT_EQ(t.policies.cache_aware.tokenize_timeout, std::chrono::milliseconds(80));
  EXPECT_EQ(t.policies.cache_aware.tokenize_max_answer_bytes, 65536u);
  ASSERT_TRUE(parse("policies: {cache_aware: {tokenize: off}}\n", &t).is_ok());
  EXPECT_FALSE(t.policies.cache_aware.tokenize_by_node);
  Topology untouched;
  s = parse("policies: {cache_aware: {tokenize: render}}\n", &untouched);
  EXPECT_FALSE(s.is_ok());
  EXPECT_THAT(s.message(), HasSubstr("expected off or node"));
  s = parse("policies: {cache_aware: {tokenize_timeout_ms: 0}}\n", &untouched);
  EXPECT_FALSE(s.is_ok());
  s = parse("policies: {cache_aware: {tokenize_max_answer_bytes: 10}}\n", &untouched);
  EXPECT_FALSE(s.is_ok());
}

// tokenize: node matches token ids on the KV events' block index: without KV events it does
// nothing, which the file is warned about (discovery/config/topology_warnings.h), not refused.
TEST(TopologyWarnings, TokenizeByNodeWithoutKvEvents) {
  EXPECT_TRUE(topology_warnings(Topology{}).empty());
  Topology t;
  ASSERT_TRUE(parse("policies: {cache_aware: {tokenize: node}}\n", &t).is_ok());
  const auto warnings = topology_warnings(t);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("policies.cache_aware.tokenize"));
  EXPECT_THAT(warnings[0], HasSubstr("kv_events.enabled"));
  ASSERT_TRUE(parse("policies: {cache_aware: {tokenize: node}}\nkv_events: {enabled: true}\n", &t).is_ok());
  EXPECT_TRUE(topology_warnings(t).empty());
  ASSERT_TRUE(parse("policies: {cache_aware: {tokenize: off}}\n", &t).is_ok());
  EXPECT_TRUE(topology_warnings(t).empty());
}

// The Kubernetes API server's bearer token must not travel in clear: warned about, not refused
// (a kubectl proxy on loopback is http:// and needs no token).
TEST(TopologyWarnings, KubernetesTokenOverPlainHttp) {
  Topology t;
  ASSERT_TRUE(parse("kubernetes: {enabled: true, api_server: \"http://127.0.0.1:8001\", namespace: ns}\n", &t).is_ok());
  auto warnings = topology_warnings(t);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("kubernetes.api_server is http://127.0.0.1:8001 (http://)"));
  EXPECT_THAT(warnings[0], HasSubstr("/var/run/secrets/kubernetes.io/serviceaccount/token"));
  EXPECT_THAT(warnings[0], HasSubstr("sent in clear"));
  // No token sent, https, or discovery off: nothing to warn about.
  ASSERT_TRUE(parse("kubernetes: {enabled: true, api_server: \"http://127.0.0.1:8001\", namespace: ns, "
                    "token_file: \"\"}\n",
                    &t)
                  .is_ok());
  EXPECT_TRUE(topology_warnings(t).empty());
  ASSERT_TRUE(parse("kubernetes: {enabled: true, api_server: \"https://127.0.0.1:6443\", namespace: ns}\n", &t).is_ok());
  EXPECT_TRUE(topology_warnings(t).empty());
  ASSERT_TRUE(parse("kubernetes: {enabled: false, api_server: \"http://127.0.0.1:8001\", namespace: ns}\n", &t).is_ok());
  EXPECT_TRUE(topology_warnings(t).empty());
}

// A right admin key passes the throttle even while its source is throttled, so a short key is
// warned about.
TEST(TopologyWarnings, ShortAdminKey) {
  Topology t;
  t.admin.api_key = "adm1n";
  auto warnings = topology_warnings(t);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("admin.api_key is 5 characters long"));
  t.admin.api_key = "0123456789abcdef";
  EXPECT_TRUE(topology_warnings(t).empty());
}

TEST(TopologyParse, AdminListenerAndProtectStatus) {
  Topology t;
  ASSERT_TRUE(parse("admin: {}\n", &t).is_ok());
  EXPECT_FALSE(t.listeners.admin.has_value());
  EXPECT_FALSE(t.admin.protect_status);
  Status s = parse("listeners:\n  admin: \"127.0.0.1:0\"\nadmin:\n  protect_status: true\n", &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.listeners.admin, (proto::HostPort{"127.0.0.1", 0}));
  EXPECT_TRUE(t.admin.protect_status);
  EXPECT_THAT(error_of("listeners:\n  admin: 127.0.0.1:70000\n", StatusCode::kOutOfRange),
              StartsWith("topo.yaml:2:10: listeners.admin: port 70000 is out of range"));
  EXPECT_THAT(error_of("admin:\n  protect_status: maybe\n", StatusCode::kWrongType),
              StartsWith("topo.yaml:2:19: admin.protect_status: "));
}

TEST(TopologyStore, DefaultsWithoutPath) {
  TopologyStore store;
  ASSERT_TRUE(store.load_initial("").is_ok());
  EXPECT_EQ(store.current()->listeners.http.port, 10001);
  EXPECT_EQ(store.reload().code(), StatusCode::kNotFound);
  EXPECT_EQ(store.reloads_failed(), 0u);
}

TEST(TopologyStore, ReloadPublishesAndCallsListeners) {
  TempDir dir;
  const std::string path = dir.write("topo.yaml", "policies: {decode: round_robin}\n");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path).is_ok());
  SnapshotReader<Topology> reader(store.cell());
  EXPECT_EQ(reader.get()->policies.decode, PolicyName::kRoundRobin);
  EXPECT_FALSE(store.last_reload().has_value());

  int calls = 0;
  store.add_listener([&](const Topology& old_t, const Topology& new_t) {
    ++calls;
    EXPECT_EQ(old_t.policies.decode, PolicyName::kRoundRobin);
    EXPECT_EQ(new_t.policies.decode, PolicyName::kPowerOfTwo);
  });
  dir.write("topo.yaml", "policies: {decode: power_of_two}\n");
  Status s = store.reload();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(reader.get()->policies.decode, PolicyName::kPowerOfTwo);
  EXPECT_EQ(store.current()->source_path, path);
  EXPECT_EQ(store.reloads_ok(), 1u);
  EXPECT_EQ(store.reloads_failed(), 0u);
  EXPECT_EQ(store.last_error(), "");
  EXPECT_TRUE(store.last_reload().has_value());
}

TEST(TopologyStore, FailedReloadKeepsOldValue) {
  TempDir dir;
  const std::string path = dir.write("topo.yaml", "workers: 2\n");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path).is_ok());
  int calls = 0;
  store.add_listener([&](const Topology&, const Topology&) { ++calls; });
  std::shared_ptr<const Topology> before = store.current();

  dir.write("topo.yaml", "workers: 3\npolicies:\n  prefill: fastest\n");
  EXPECT_FALSE(store.reload().is_ok());
  EXPECT_EQ(store.current(), before);
  EXPECT_EQ(store.current()->workers, 2u);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(store.reloads_ok(), 0u);
  EXPECT_EQ(store.reloads_failed(), 1u);
  EXPECT_THAT(store.last_error(),
              StartsWith(path + ":3:12: policies.prefill: unknown policy 'fastest'"));
  EXPECT_TRUE(store.last_reload().has_value());

  dir.write("topo.yaml", "workers: 4\n");
  ASSERT_TRUE(store.reload().is_ok());
  EXPECT_EQ(store.current()->workers, 4u);
  EXPECT_EQ(store.last_error(), "");
  EXPECT_EQ(calls, 1);
}

// A reader on another thread (a worker rendering /metrics or /status) that sees a reload
// counted must see that reload through: a failure's last_error, a success's listeners done.
// Counting first left a window where /status showed the new count beside the previous
// last_error (and cached that page), and a test waiting for the count read the old state.
TEST(TopologyStore, ACountSeenOnAnotherThreadComesWithItsOutcome) {
  TempDir dir;
  const std::string path = dir.write("topo.yaml", "workers: 1\n");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path).is_ok());
  std::atomic<uint64_t> applied{0};
  store.add_listener([&](const Topology&, const Topology&) {
    std::this_thread::sleep_for(1ms);  // a listener that takes its time (TLS contexts, discovery)
    applied.fetch_add(1);
  });
  constexpr uint64_t kRounds = 40;
  std::atomic<bool> done{false};
  std::atomic<uint64_t> early_ok{0}, stale_error{0};
  std::thread reader([&] {
    while (!done.load()) {
      if (store.reloads_ok() > applied.load()) early_ok.fetch_add(1);
      // Failure k writes port 70000 + k: once k failures are counted, last_error names the k-th
      // or a later one (or is "" after a later success).
      const uint64_t failed = store.reloads_failed();
      const std::string error = store.last_error();
      if (failed == 0 || error.empty()) continue;
      const size_t at = error.find("port 7");
      if (at == std::string::npos || std::stoull(error.substr(at + 5, 5)) - 70000 < failed) {
        stale_error.fetch_add(1);
      }
    }
  });
  for (uint64_t k = 1; k <= kRounds; ++k) {
    dir.write("topo.yaml", "listeners:\n  http: \"127.0.0.1:" + std::to_string(70000 + k) + "\"\n");
    EXPECT_FALSE(store.reload().is_ok());
    dir.write("topo.yaml", "workers: " + std::to_string(k + 1) + "\n");
    EXPECT_TRUE(store.reload().is_ok());
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(early_ok.load(), 0u) << "reloads_ok counted before the listeners applied the reload";
  EXPECT_EQ(stale_error.load(), 0u) << "reloads_failed counted before last_error named the failure";
  EXPECT_EQ(store.reloads_ok(), kRounds);
  EXPECT_EQ(store.reloads_failed(), kRounds);
  EXPECT_EQ(applied.load(), kRounds);
}

// An empty file (a writer between truncating and writing) on reload is
// refused and keeps the running topology; at start-up it still means defaults.
TEST(TopologyStore, EmptyFileOnReloadIsRefused) {
  TempDir dir;
  const std::string path = dir.write("topo.yaml", "workers: 2\n");
  TopologyStore store;
  ASSERT_TRUE(store.load_initial(path).is_ok());
  std::shared_ptr<const Topology> before = store.current();
  for (const char* empty : {"", "\n  \n\t"}) {
    dir.write("topo.yaml", empty);
    Status s = store.reload();
    EXPECT_EQ(s.code(), StatusCode::kInvalidValue);
    EXPECT_THAT(s.message(), StartsWith(path + ": the file is empty"));
    EXPECT_EQ(store.current(), before);
  }
  EXPECT_EQ(store.reloads_failed(), 2u);
  EXPECT_EQ(store.reloads_ok(), 0u);
  EXPECT_THAT(store.last_error(), StartsWith(path + ": the file is empty (whitespace only)"));
  dir.write("topo.yaml", "# only a comment\nworkers: 3\n");
  ASSERT_TRUE(store.reload().is_ok());
  EXPECT_EQ(store.current()->workers, 3u);

  TopologyStore fresh;
  ASSERT_TRUE(fresh.load_initial(dir.write("empty.yaml", "")).is_ok());
  EXPECT_EQ(fresh.current()->workers, 0u);
}

TEST(TopologyStore, InitialLoadErrorIsReturned) {
  TempDir dir;
  const std::string path = dir.write("topo.yaml", "workers: [\n");
  TopologyStore store;
  Status s = store.load_initial(path);
  EXPECT_EQ(s.code(), StatusCode::kMalformed);
  EXPECT_THAT(s.message(), StartsWith(path + ":"));
  EXPECT_EQ(store.current()->workers, 0u);
}

}  // namespace
}  // namespace pdr::config

namespace pdr::config {
namespace {

TEST(TopologyParse, RegistrySectionForTheEtcdBackend) {
  Topology defaults;
  ASSERT_TRUE(parse("", &defaults).is_ok());
  EXPECT_EQ(defaults.registry.backend, "memory");
  EXPECT_TRUE(defaults.registry.etcd_endpoints.empty());
  EXPECT_EQ(defaults.registry.etcd_prefix, "/pdrouter/");
  EXPECT_EQ(defaults.registry.lease_ttl, std::chrono::seconds(10));

  Topology t;
  Status s = parse(R"(
registry:
  backend: etcd
  etcd_endpoints: ["127.0.0.1:2379", "http://127.0.30.2:2379"]
  etcd_prefix: "/prod/"
  replica_id: "router-0"
  lease_ttl_s: 4
  etcd_user: pdr
)", &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.registry.backend, "etcd");
  ASSERT_EQ(t.registry.etcd_endpoints.size(), 2u);
  EXPECT_EQ(t.registry.etcd_endpoints[1], (proto::HostPort{"127.0.30.2", 2379}));
  EXPECT_EQ(t.registry.etcd_prefix, "/prod/");
  EXPECT_EQ(t.registry.replica_id, "router-0");
  EXPECT_EQ(t.registry.lease_ttl, std::chrono::seconds(4));
  EXPECT_EQ(t.registry.etcd_user, "pdr");

  EXPECT_THAT(error_of("registry:\n  backend: zookeeper\n", StatusCode::kInvalidValue),
              HasSubstr("registry.backend: expected memory or etcd"));
  EXPECT_THAT(error_of("registry:\n  backend: etcd\n", StatusCode::kMissingKey),
              HasSubstr("backend etcd needs etcd_endpoints"));
  EXPECT_THAT(error_of("registry:\n  etcd_endpoints: [\"https://127.0.0.1:2379\", \"127.0.0.2:2379\"]\n",
                       StatusCode::kInvalidValue),
              HasSubstr("mixes https and plain endpoints"));
  EXPECT_THAT(error_of("registry:\n  replica_id: \"a/b\"\n", StatusCode::kInvalidValue),
              HasSubstr("must not contain '/'"));
  EXPECT_THAT(error_of("registry:\n  lease_ttl_s: 1\n", StatusCode::kOutOfRange),
              HasSubstr("registry.lease_ttl_s: 1 is out of range"));
}

TEST(TopologyParse, RegistryEtcdOverTls) {
  TempDir dir;
  const std::string cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  const std::string key = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n";
  const std::string ca_path = dir.write("ca.crt", cert);
  const std::string cert_path = dir.write("client.crt", cert);
  const std::string key_path = dir.write("client.key", key);
  const std::string endpoints = "  etcd_endpoints: [\"https://127.0.0.1:2379\", \"https://127.0.0.2:2379\"]\n";
  Topology t;
  Status s = parse("registry:\n  backend: etcd\n" + endpoints + "  etcd_ca_file: " + ca_path +
                       "\n  etcd_cert_file: " + cert_path + "\n  etcd_key_file: " + key_path + "\n",
                   &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.registry.etcd_tls);
  EXPECT_EQ(t.registry.etcd_endpoints[1], (proto::HostPort{"127.0.0.2", 2379}));
  EXPECT_EQ(t.registry.etcd_ca_file, ca_path);
  EXPECT_EQ(t.registry.etcd_ca_pem, cert);
  EXPECT_EQ(t.registry.etcd_cert_pem, cert);
  EXPECT_EQ(t.registry.etcd_key_pem, key);

  // Untrusted files: PEM of the right kind, size-capped, readable.
  const std::string junk = dir.write("junk.pem", "hello\n");
  EXPECT_THAT(error_of("registry:\n" + endpoints + "  etcd_ca_file: " + junk + "\n", StatusCode::kInvalidValue),
              HasSubstr("registry.etcd_ca_file: '" + junk + "' holds no PEM CERTIFICATE-----"));
  EXPECT_THAT(error_of("registry:\n" + endpoints + "  etcd_cert_file: " + cert_path + "\n  etcd_key_file: " +
                           cert_path + "\n",
                       StatusCode::kInvalidValue),
              HasSubstr("holds no PEM PRIVATE KEY-----"));
  const std::string big = dir.write("big.pem", cert + std::string(2 << 20, 'x'));
  EXPECT_THAT(error_of("registry:\n" + endpoints + "  etcd_ca_file: " + big + "\n", StatusCode::kTooLarge),
              HasSubstr("registry.etcd_ca_file"));
  EXPECT_THAT(error_of("registry:\n" + endpoints + "  etcd_ca_file: " + dir.file("missing.crt") + "\n",
                       StatusCode::kIoError),
              HasSubstr("cannot open"));
  // Together, and only with https.
  EXPECT_THAT(error_of("registry:\n" + endpoints + "  etcd_cert_file: " + cert_path + "\n",
                       StatusCode::kInvalidValue),
              HasSubstr("etcd_cert_file and etcd_key_file go together"));
  EXPECT_THAT(error_of("registry:\n  etcd_endpoints: [\"127.0.0.1:2379\"]\n  etcd_ca_file: " + ca_path + "\n",
                       StatusCode::kInvalidValue),
              HasSubstr("need https:// etcd_endpoints"));
}

}  // namespace
}  // namespace pdr::config

namespace pdr::config {
namespace {

TEST(TopologyParse, KubernetesPodRolesFromLabelSelectors) {
  Topology t;
  Status s = parse(R"yaml(
kubernetes:
  enabled: true
  api_server: "http://127.0.0.1:8001"
  namespace: llm
  label_selector: "app in (vllm,sglang)"
  prefill_selector: "llm-d.ai/role in (prefill, prefill-decode), !canary"
  decode_selector: "llm-d.ai/role=decode"
)yaml", &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.kubernetes.uses_selectors());
  EXPECT_EQ(t.kubernetes.prefill_selector.text, "llm-d.ai/role in (prefill, prefill-decode), !canary");
  ASSERT_EQ(t.kubernetes.prefill_selector.requirements.size(), 2u);
  EXPECT_EQ(t.kubernetes.decode_selector.requirements.size(), 1u);
  EXPECT_FALSE(t.kubernetes.role_label_set);

  Topology plain;  // the role-label way loads as before
  ASSERT_TRUE(parse("kubernetes:\n  role_label: example.com/role\n", &plain).is_ok());
  EXPECT_FALSE(plain.kubernetes.uses_selectors());
  EXPECT_TRUE(plain.kubernetes.role_label_set);

  EXPECT_THAT(error_of("kubernetes:\n  prefill_selector: \"a=b\"\n  decode_selector: \"a=c\"\n"
                       "  role_label: example.com/role\n",
                       StatusCode::kInvalidValue),
              HasSubstr("kubernetes: set role_label or prefill_selector/decode_selector, not both"));
  EXPECT_THAT(error_of("kubernetes:\n  prefill_selector: \"a=b\"\n", StatusCode::kMissingKey),
              HasSubstr("prefill_selector and decode_selector go together"));
  EXPECT_THAT(error_of("kubernetes:\n  decode_selector: \"a=b\"\n", StatusCode::kMissingKey),
              HasSubstr("prefill_selector and decode_selector go together"));
  EXPECT_THAT(error_of("kubernetes:\n  prefill_selector: \"a in (x,\"\n  decode_selector: \"a=c\"\n",
                       StatusCode::kInvalidValue),
              HasSubstr("topo.yaml:2:21: kubernetes.prefill_selector: label selector at 8: expected a label value in the set, "
                        "found the end"));
  EXPECT_THAT(error_of("kubernetes:\n  prefill_selector: \"a=b\"\n  decode_selector: \"a>1\"\n",
                       StatusCode::kInvalidValue),
              HasSubstr("kubernetes.decode_selector: label selector at 1: the comparison operators"));
  EXPECT_THAT(error_of("kubernetes:\n  prefill_selector: \" \"\n  decode_selector: \"a=c\"\n",
                       StatusCode::kInvalidValue),
              HasSubstr("must not be empty"));
}

TEST(TopologyParse, KubernetesSectionForPodDiscovery) {
  Topology defaults;
  ASSERT_TRUE(parse("", &defaults).is_ok());
  EXPECT_FALSE(defaults.kubernetes.enabled);
  EXPECT_EQ(defaults.kubernetes.token_file, "/var/run/secrets/kubernetes.io/serviceaccount/token");
  EXPECT_EQ(defaults.kubernetes.role_label, "pdrouter.io/role");
  EXPECT_EQ(defaults.kubernetes.port, 8000);

  Topology t;
  Status s = parse(R"(
kubernetes:
  enabled: true
  api_server: "http://127.0.0.1:8001/"
  namespace: llm-prod
  label_selector: "app=vllm"
  token_file: ""
  token_refresh_ms: 5000
  role_label: "example.com/role"
  port: 9000
  watch_timeout_s: 60
  retry_ms: 250
)", &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.kubernetes.enabled);
  EXPECT_EQ(t.kubernetes.api_server, (proto::HostPort{"127.0.0.1", 8001}));
  EXPECT_EQ(t.kubernetes.namespace_name, "llm-prod");
  EXPECT_EQ(t.kubernetes.label_selector, "app=vllm");
  EXPECT_EQ(t.kubernetes.token_file, "");
  EXPECT_EQ(t.kubernetes.token_refresh, 5000ms);
  EXPECT_EQ(t.kubernetes.role_label, "example.com/role");
  EXPECT_EQ(t.kubernetes.port, 9000);
  EXPECT_EQ(t.kubernetes.watch_timeout, std::chrono::seconds(60));
  EXPECT_EQ(t.kubernetes.retry, 250ms);

  {
    Topology https;
    ASSERT_TRUE(parse("kubernetes:\n  api_server: https://127.0.0.1:6443\n", &https).is_ok());
    EXPECT_TRUE(https.kubernetes.api_server_tls);
    EXPECT_EQ(https.kubernetes.api_server.port, 6443);
    EXPECT_TRUE(https.kubernetes.ca_pem.empty());  // no ca_file: the system's CAs
  }
  EXPECT_THAT(error_of("kubernetes:\n  api_server: 127.0.0.1:6443\n", StatusCode::kInvalidValue),
              HasSubstr("expected http://host:port or https://host:port"));
  EXPECT_THAT(error_of("kubernetes:\n  enabled: true\n  namespace: llm\n", StatusCode::kMissingKey),
              HasSubstr("kubernetes.enabled needs api_server and namespace"));
  EXPECT_THAT(error_of("kubernetes:\n  namespace: Bad_NS\n", StatusCode::kInvalidValue),
              HasSubstr("expected a namespace name"));
  EXPECT_THAT(error_of("kubernetes:\n  role_label: \"\"\n", StatusCode::kInvalidValue), HasSubstr("must not be empty"));
  EXPECT_THAT(error_of("kubernetes:\n  label: x\n", StatusCode::kInvalidValue),
              HasSubstr("unknown key 'label' in kubernetes"));
}

TEST(TopologyParse, ClientAuthKeysFile) {
  TempDir dir;
  dir.write("clients.keys", "# who may call\nsk-team-a-0123456789abcdef team-a\nsk-team-b-0123456789abcdef team-b\n");
  const std::string topo_path =
      dir.write("topo.yaml", "client_auth:\n  keys_file: clients.keys\n  forward_client_key: true\n");
  Topology t;
  Status s = load_topology_file(topo_path, &t);  // relative to the topology file
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.client_auth.enabled());
  EXPECT_EQ(t.client_auth.keys_file, "clients.keys");
  EXPECT_TRUE(t.client_auth.forward_client_key);
  ASSERT_EQ(t.client_auth.keys.keys.size(), 2u);
  ASSERT_NE(t.client_auth.keys.find("sk-team-b-0123456789abcdef"), nullptr);
  EXPECT_EQ(*t.client_auth.keys.find("sk-team-b-0123456789abcdef"), "team-b");

  Topology defaults;
  ASSERT_TRUE(parse("", &defaults).is_ok());
  EXPECT_FALSE(defaults.client_auth.enabled());
  EXPECT_FALSE(defaults.client_auth.forward_client_key);

  // A bad line is named by the file and its line, never by its key.
  const std::string bad = dir.write("bad.keys", "sk-team-a-0123456789abcdef team-a\nsk-tiny team-b\n");
  std::string msg = error_of("client_auth:\n  keys_file: " + bad + "\n", StatusCode::kInvalidValue);
  EXPECT_THAT(msg, StartsWith("topo.yaml:2:14: client_auth.keys_file: '" + bad + "': line 2: the key is shorter"));
  EXPECT_THAT(msg, Not(HasSubstr("sk-tiny")));
  msg = error_of("client_auth:\n  keys_file: " + dir.file("missing.keys") + "\n", StatusCode::kIoError);
  EXPECT_THAT(msg, HasSubstr("cannot open"));
  EXPECT_THAT(error_of("client_auth:\n  keysfile: x\n", StatusCode::kInvalidValue),
              HasSubstr("unknown key 'keysfile' in client_auth"));

  // An empty key file locks every client out: allowed, with a warning.
  const std::string empty = dir.write("empty.keys", "# nobody yet\n");
  ASSERT_TRUE(parse("client_auth: {keys_file: " + empty + "}\n", &t).is_ok());
  EXPECT_TRUE(t.client_auth.enabled());
  const auto warnings = topology_warnings(t);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("holds no key"));
}

TEST(TopologyParse, Tenants) {
  Topology t;
  Status s = parse(
      "tenants:\n"
      "  header: X-Tenant-Id\n"
      "  defaults: {requests_per_second: 10, tokens_per_minute: 6000}\n"
      "  limits:\n"
      "    team-b: {max_in_flight: 4, priority: 7}\n"
      "    team-a: {requests_per_second: 2, burst: 5, tokens_per_minute: 0}\n",
      &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_EQ(t.tenants.header, "x-tenant-id");
  EXPECT_EQ(t.tenants.defaults.requests_per_second, 10u);
  ASSERT_EQ(t.tenants.limits.size(), 2u);
  EXPECT_EQ(t.tenants.limits[0].first, "team-a");
  const auto& a = t.tenants.limits_of("team-a");
  EXPECT_EQ(a.requests_per_second, 2u);
  EXPECT_EQ(a.burst, 5u);
  EXPECT_EQ(a.tokens_per_minute, 0u);  // written: no limit
  const auto& b = t.tenants.limits_of("team-b");
  EXPECT_EQ(b.max_in_flight, 4u);
  EXPECT_EQ(b.priority, 7u);
  EXPECT_EQ(a.priority, 4u);  // the default class
  EXPECT_EQ(b.requests_per_second, 10u);  // not written: the defaults'
  EXPECT_EQ(b.tokens_per_minute, 6000u);
  EXPECT_EQ(&t.tenants.limits_of("nobody"), &t.tenants.defaults);

  EXPECT_THAT(error_of("tenants:\n  limits:\n    other: {max_in_flight: 1}\n", StatusCode::kInvalidValue),
              HasSubstr("'other' is not a tenant name"));
  EXPECT_THAT(error_of("tenants:\n  limits:\n    \"a b\": {max_in_flight: 1}\n", StatusCode::kInvalidValue),
              HasSubstr("is not a tenant name"));
  EXPECT_THAT(error_of("tenants:\n  limits:\n    a: {rps: 1}\n", StatusCode::kInvalidValue),
              HasSubstr("unknown key 'rps' in tenants.limits.a"));
  EXPECT_THAT(error_of("tenants:\n  defaults: {requests_per_second: -1}\n", StatusCode::kOutOfRange),
              HasSubstr("tenants.defaults.requests_per_second"));
  EXPECT_THAT(error_of("tenants:\n  header: \"x tenant\"\n", StatusCode::kInvalidValue),
              HasSubstr("not a valid HTTP header name"));
  EXPECT_THAT(error_of("tenants:\n  limits: [a]\n", StatusCode::kWrongType), HasSubstr("expected a map"));
  EXPECT_THAT(error_of("tenants:\n  defaults: {priority: 8}\n", StatusCode::kOutOfRange),
              HasSubstr("tenants.defaults.priority"));
}

TEST(TopologyParse, AdmissionQueueIsOnByDefaultAndZeroTurnsItOff) {
  Topology t;
  ASSERT_TRUE(parse("", &t).is_ok());
  EXPECT_TRUE(t.limits.queue_enabled());
  EXPECT_EQ(t.limits.max_queued_requests, 1024u);
  EXPECT_EQ(t.limits.max_queued_bytes, 256u << 20);
  EXPECT_EQ(t.limits.queue_timeout, 30000ms);
  for (const char* off : {"max_queued_requests: 0", "max_queued_bytes: 0", "queue_timeout_ms: 0"}) {
    ASSERT_TRUE(parse(std::string("limits:\n  ") + off + "\n", &t).is_ok()) << off;
    EXPECT_FALSE(t.limits.queue_enabled()) << off;
  }
  EXPECT_THAT(error_of("limits:\n  max_queued_requests: 1000001\n", StatusCode::kOutOfRange),
              HasSubstr("limits.max_queued_requests"));
  EXPECT_THAT(error_of("limits:\n  queue_timeout_ms: -5\n", StatusCode::kOutOfRange),
              HasSubstr("limits.queue_timeout_ms"));
}

TEST(TopologyParse, AccessLog) {
  Topology t;
  ASSERT_TRUE(parse("", &t).is_ok());
  EXPECT_TRUE(t.access_log.path.empty());
  ASSERT_TRUE(parse("access_log: {path: /var/log/pdrouter/access.log, max_queued_lines: 100}\n", &t).is_ok());
  EXPECT_EQ(t.access_log.path, "/var/log/pdrouter/access.log");
  EXPECT_EQ(t.access_log.max_queued_lines, 100u);
  ASSERT_TRUE(parse("access_log: {path: stderr}\n", &t).is_ok());
  EXPECT_EQ(t.access_log.path, "stderr");
  EXPECT_THAT(error_of("access_log: {path: logs/access.log}\n", StatusCode::kInvalidValue),
              HasSubstr("expected an absolute path or stderr"));
  EXPECT_THAT(error_of("access_log: {max_queued_lines: 1}\n", StatusCode::kOutOfRange),
              HasSubstr("access_log.max_queued_lines"));
}

TEST(TopologyWarnings, ClientSettingsThatDoNothing) {
  TempDir dir;
  const std::string keys = dir.write("k.keys", "sk-team-a-0123456789abcdef team-a\n");
  ScopedEnv env("PDR_TEST_UPSTREAM_KEY", "node-key");
  Topology t;
  ASSERT_TRUE(parse("client_auth: {keys_file: " + keys + ", forward_client_key: true}\n"
                    "tenants: {header: x-tenant}\n"
                    "connectors: {upstream_api_key_env: PDR_TEST_UPSTREAM_KEY}\n",
                    &t)
                  .is_ok());
  const auto warnings = topology_warnings(t);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_THAT(warnings[0], HasSubstr("tenants.header is ignored"));
  EXPECT_THAT(warnings[1], HasSubstr("forward_client_key has no effect"));
}

}  // namespace
}  // namespace pdr::config
