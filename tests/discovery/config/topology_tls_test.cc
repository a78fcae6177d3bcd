// The topology keys about TLS and tracing (discovery/config/topology_tls.h): listeners.tls,
// listeners.admin_tls, connectors.tls, an instance's tls, tracing; and which of their changes
// need a restart.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "discovery/config/topology.h"
#include "discovery/config/topology_store.h"

namespace pdr::config {
namespace {

using ::testing::HasSubstr;

const std::string kCert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
const std::string kKey = "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n";

Status parse(const std::string& text, Topology* out) { return parse_topology(text, "topo.yaml", out); }

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
    std::string templ = (std::filesystem::temp_directory_path() / "pdr-topo-tls-XXXXXX").string();
    path_ = ::mkdtemp(templ.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& content) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file, std::ios::binary | std::ios::trunc) << content;
    return file;
  }

 private:
  std::string path_;
};

TEST(TopologyTls, ListenerTlsReadsTheFiles) {
  TempDir dir;
  const std::string cert = dir.write("server.crt", kCert + kCert);
  const std::string key = dir.write("server.key", kKey);
  const std::string ca = dir.write("ca.crt", kCert);
  Topology t;
  Status s = parse("listeners:\n  admin: 127.0.0.1:10002\n  tls:\n    cert_file: " + cert + "\n    key_file: " + key +
                       "\n  admin_tls:\n    cert_file: " + cert + "\n    key_file: " + key +
                       "\n    client_ca_file: " + ca + "\n",
                   &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.listeners.tls.enabled());
  EXPECT_EQ(t.listeners.tls.cert_pem, kCert + kCert);
  EXPECT_EQ(t.listeners.tls.key_pem, kKey);
  EXPECT_TRUE(t.listeners.tls.client_ca_file.empty());
  EXPECT_EQ(t.listeners.admin_tls.client_ca_pem, kCert);
  Topology defaults;
  ASSERT_TRUE(parse("", &defaults).is_ok());
  EXPECT_FALSE(defaults.listeners.tls.enabled());
  EXPECT_FALSE(defaults.listeners.admin_tls.enabled());
}

TEST(TopologyTls, ListenerTlsMistakesAreNamed) {
  TempDir dir;
  const std::string cert = dir.write("server.crt", kCert);
  const std::string key = dir.write("server.key", kKey);
  EXPECT_THAT(error_of("listeners:\n  tls:\n    cert_file: " + cert + "\n", StatusCode::kMissingKey),
              HasSubstr("listeners.tls: cert_file and key_file go together"));
  EXPECT_THAT(error_of("listeners:\n  tls:\n    cert_file: " + key + "\n    key_file: " + key + "\n",
                       StatusCode::kInvalidValue),
              HasSubstr("listeners.tls.cert_file: '" + key + "' holds no PEM CERTIFICATE-----"));
  EXPECT_THAT(error_of("listeners:\n  tls:\n    client_ca_file: " + cert + "\n", StatusCode::kMissingKey),
              HasSubstr("client_ca_file needs cert_file and key_file"));
  EXPECT_THAT(error_of("listeners:\n  admin_tls:\n    cert_file: " + cert + "\n    key_file: " + key + "\n",
                       StatusCode::kMissingKey),
              HasSubstr("admin_tls needs listeners.admin"));
  EXPECT_THAT(error_of("listeners:\n  tls:\n    cert_file: " + cert + "\n    key_file: " + key + "\n    ciphers: x\n",
                       StatusCode::kInvalidValue),
              HasSubstr("ciphers"));
  EXPECT_THAT(error_of("listeners:\n  tls:\n    cert_file: /nonexistent/pdr.crt\n    key_file: " + key + "\n",
                       StatusCode::kIoError),
              HasSubstr("cannot open"));
}

TEST(TopologyTls, NodeTlsSectionAndInstanceOverrides) {
  TempDir dir;
  const std::string ca = dir.write("ca.crt", kCert);
  const std::string cert = dir.write("client.crt", kCert);
  const std::string key = dir.write("client.key", kKey);
  Topology t;
  Status s = parse("connectors:\n  default: nixl\n  tls:\n    ca_file: " + ca + "\n    cert_file: " + cert +
                       "\n    key_file: " + key + "\n    server_name: vllm.internal\n"
                       "instances:\n"
                       "  - {role: prefill, http_address: \"127.0.0.1:8100\", tls: {enabled: false}}\n"
                       "  - {role: decode, http_address: \"127.0.0.1:8200\", tls: {server_name: \"127.0.0.1\"}}\n"
                       "  - {role: decode, http_address: \"127.0.0.1:8300\"}\n",
                   &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.connectors.tls.enabled);
  EXPECT_EQ(t.connectors.tls.ca_pem, kCert);
  EXPECT_EQ(t.connectors.tls.key_pem, kKey);
  ASSERT_EQ(t.connectors.tls_by_node.size(), 2u);
  EXPECT_FALSE(t.connectors.tls_for({"127.0.0.1", 8100}).enabled);
  const NodeTls& own = t.connectors.tls_for({"127.0.0.1", 8200});
  EXPECT_TRUE(own.enabled);
  EXPECT_EQ(own.server_name, "127.0.0.1");
  EXPECT_EQ(own.cert_pem, kCert);  // the section's, under the instance's own settings
  EXPECT_EQ(&t.connectors.tls_for({"127.0.0.1", 8300}), &t.connectors.tls);
  EXPECT_EQ(&t.connectors.tls_for({"127.0.0.9", 1}), &t.connectors.tls);

  // A node section without a CA uses the system's store; enabled: false keeps it written but off.
  Topology off;
  ASSERT_TRUE(parse("connectors:\n  tls: {enabled: false}\n", &off).is_ok());
  EXPECT_FALSE(off.connectors.tls.enabled);
  Topology system_ca;
  ASSERT_TRUE(parse("connectors:\n  tls: {}\n", &system_ca).is_ok());
  EXPECT_TRUE(system_ca.connectors.tls.enabled);
  EXPECT_TRUE(system_ca.connectors.tls.ca_pem.empty());

  EXPECT_THAT(error_of("connectors:\n  tls:\n    cert_file: " + cert + "\n", StatusCode::kMissingKey),
              HasSubstr("connectors.tls: cert_file and key_file go together (mutual TLS)"));
  EXPECT_THAT(error_of("connectors:\n  tls:\n    server_name: \"a b\"\n", StatusCode::kInvalidValue),
              HasSubstr("is not a host name or an IP address"));
  EXPECT_THAT(error_of("instances:\n  - {role: decode, http_address: \"127.0.0.1:8200\", tls: {verify: false}}\n",
                       StatusCode::kInvalidValue),
              HasSubstr("instances[0].tls"));
}

TEST(TopologyTls, TracingSection) {
  Topology t;
  ASSERT_TRUE(parse("", &t).is_ok());
  EXPECT_FALSE(t.tracing.enabled());
  Status s = parse(
      "tracing:\n  endpoint: http://127.0.0.1:4318/v1/traces\n  sampling_ratio: 0.05\n  service_name: router-a\n"
      "  max_queue_spans: 100\n  batch_ms: 250\n  max_batch_spans: 50\n  export_timeout_ms: 900\n",
      &t);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_TRUE(t.tracing.enabled());
  EXPECT_EQ(t.tracing.collector, (proto::HostPort{"127.0.0.1", 4318}));
  EXPECT_EQ(t.tracing.collector_path, "/v1/traces");
  EXPECT_DOUBLE_EQ(t.tracing.sampling_ratio, 0.05);
  EXPECT_EQ(t.tracing.service_name, "router-a");
  EXPECT_EQ(t.tracing.max_queue_spans, 100u);
  EXPECT_EQ(t.tracing.batch, std::chrono::milliseconds(250));
  EXPECT_EQ(t.tracing.max_batch_spans, 50u);
  EXPECT_EQ(t.tracing.export_timeout, std::chrono::milliseconds(900));
  ASSERT_TRUE(parse("tracing:\n  endpoint: \"http://collector.local:4318\"\n", &t).is_ok());
  EXPECT_EQ(t.tracing.collector_path, "/v1/traces");
  EXPECT_EQ(t.tracing.collector.host, "collector.local");

  EXPECT_THAT(error_of("tracing:\n  endpoint: https://127.0.0.1:4318/v1/traces\n", StatusCode::kInvalidValue),
              HasSubstr("expected http://host:port/path"));
  EXPECT_THAT(error_of("tracing:\n  sampling_ratio: 1.5\n", StatusCode::kOutOfRange),
              HasSubstr("tracing.sampling_ratio: expected a number from 0 to 1, got '1.5'"));
  EXPECT_THAT(error_of("tracing:\n  sampling_ratio: lots\n", StatusCode::kOutOfRange), HasSubstr("got 'lots'"));
  EXPECT_THAT(error_of("tracing:\n  max_queue_spans: 2\n", StatusCode::kOutOfRange), HasSubstr("max_queue_spans"));
  EXPECT_THAT(error_of("tracing:\n  endpoint: http://127.0.0.1/v1/traces\n", StatusCode::kBadAddress),
              HasSubstr("tracing.endpoint"));
}

TEST(TopologyTls, WhatARestartIsNeededFor) {
  TempDir dir;
  const std::string cert = dir.write("server.crt", kCert);
  const std::string key = dir.write("server.key", kKey);
  Topology plain, tls, renewed, traced, resampled;
  ASSERT_TRUE(parse("", &plain).is_ok());
  const std::string listener = "listeners:\n  tls:\n    cert_file: " + cert + "\n    key_file: " + key + "\n";
  ASSERT_TRUE(parse(listener, &tls).is_ok());
  dir.write("server.crt", kCert + kCert);  // renewed in place
  ASSERT_TRUE(parse(listener, &renewed).is_ok());
  ASSERT_TRUE(parse("tracing:\n  endpoint: http://127.0.0.1:4318/v1/traces\n", &traced).is_ok());
  ASSERT_TRUE(parse("tracing:\n  endpoint: http://127.0.0.1:4318/v1/traces\n  sampling_ratio: 0.5\n", &resampled).is_ok());
  EXPECT_THAT(restart_required_changes(plain, tls), testing::ElementsAre("listeners.tls: off -> on"));
  EXPECT_TRUE(restart_required_changes(tls, renewed).empty());  // applied live
  EXPECT_THAT(restart_required_changes(plain, traced),
              testing::ElementsAre("tracing.endpoint: '' -> 'http://127.0.0.1:4318/v1/traces'"));
  EXPECT_TRUE(restart_required_changes(traced, resampled).empty());
}

}  // namespace
}  // namespace pdr::config
