#include "proto/address.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

// Addresses: IPv4 ones are in 127.0.0.0/8. The IPv6 ones (fd00::/8) are not ::1 because the IPv6
// forms are what is checked (groups, brackets, zone ids), and the malformed text
// (1.2.3.4.5, 256.0.0.1) is refused: all of it is only parsed here, nothing connects to it.

using namespace std::string_literals;

::testing::AssertionResult BadAddress(const Status& status, std::string_view substring) {
  if (status.code() != StatusCode::kBadAddress) {
    return ::testing::AssertionFailure() << "expected bad_address, got " << status.to_string();
  }
  if (status.message().find(substring) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message '" << status.message() << "' lacks '" << substring << "'";
  }
  return ::testing::AssertionSuccess();
}

// ---- parse_host ----

TEST(ParseHost, AcceptsIpv4DnsAndIpv6) {
  std::string host;
  ASSERT_TRUE(parse_host("127.0.10.5", &host).is_ok());
  EXPECT_EQ(host, "127.0.10.5");
  ASSERT_TRUE(parse_host("0.0.0.0", &host).is_ok());
  ASSERT_TRUE(parse_host("255.255.255.255", &host).is_ok());
  ASSERT_TRUE(parse_host("node-3.example", &host).is_ok());
  EXPECT_EQ(host, "node-3.example");
  ASSERT_TRUE(parse_host("pod_7.svc", &host).is_ok());
  ASSERT_TRUE(parse_host("localhost", &host).is_ok());
  ASSERT_TRUE(parse_host("fd00::5", &host).is_ok());
  EXPECT_EQ(host, "fd00::5");
  ASSERT_TRUE(parse_host("[fd00::5]", &host).is_ok());
  EXPECT_EQ(host, "fd00::5") << "brackets are stripped";
  ASSERT_TRUE(parse_host("::ffff:127.0.10.1", &host).is_ok());
  ASSERT_TRUE(
      parse_host(
          std::string(253, 'a').replace(63, 1, ".").replace(127, 1, ".").replace(191, 1, "."),
          &host)
          .is_ok());
}

TEST(ParseHost, RejectsBadIpv4) {
  std::string host;
  EXPECT_TRUE(BadAddress(parse_host("256.0.0.1", &host), "above 255"));
  EXPECT_TRUE(BadAddress(parse_host("1.2.3", &host), "four octets"));
  EXPECT_TRUE(BadAddress(parse_host("1.2.3.4.5", &host), "more than four"));
  EXPECT_TRUE(BadAddress(parse_host("01.2.3.4", &host), "leading zero"));
  EXPECT_TRUE(BadAddress(parse_host("1..2.3", &host), "empty or long octet"));
  EXPECT_TRUE(BadAddress(parse_host("1.2.3.1000", &host), "not a valid IPv4"));
  EXPECT_TRUE(BadAddress(parse_host("12345", &host), "not a valid IPv4"));
}

TEST(ParseHost, RejectsBadNamesAndIpv6) {
  std::string host;
  EXPECT_TRUE(BadAddress(parse_host("", &host), "host is empty"));
  EXPECT_TRUE(BadAddress(parse_host("my host", &host), "character outside"));
  EXPECT_TRUE(BadAddress(parse_host("a\0b"s, &host), "character outside"));
  EXPECT_TRUE(BadAddress(parse_host("a..b", &host), "empty label"));
  EXPECT_TRUE(BadAddress(parse_host("a.", &host), "empty label"));
  EXPECT_TRUE(BadAddress(parse_host(std::string(64, 'a'), &host), "longer than 63"));
  EXPECT_TRUE(BadAddress(parse_host(std::string(254, 'a'), &host), "254 chars, limit 253"));
  EXPECT_TRUE(BadAddress(parse_host("[fd00::5", &host), "closing ']'"));
  EXPECT_TRUE(BadAddress(parse_host("fd00::5%eth0", &host), "not a valid IPv6"));
  EXPECT_TRUE(BadAddress(parse_host("fd00:::5", &host), "not a valid IPv6"));
  EXPECT_TRUE(BadAddress(parse_host("[1.2.3.4]", &host), "not a valid IPv6"));
  EXPECT_TRUE(BadAddress(parse_host("fd00::5\0:1"s, &host), "not a valid IPv6"));
}

// ---- parse_host_port ----

TEST(ParseHostPort, AcceptsHostPortForms) {
  HostPort hp;
  ASSERT_TRUE(parse_host_port("127.0.10.5:8000", &hp).is_ok());
  EXPECT_EQ(hp.host, "127.0.10.5");
  EXPECT_EQ(hp.port, 8000);
  EXPECT_FALSE(hp.is_ipv6());
  EXPECT_EQ(hp.to_string(), "127.0.10.5:8000");

  ASSERT_TRUE(parse_host_port("node-3.example:1", &hp).is_ok());
  EXPECT_EQ(hp, (HostPort{"node-3.example", 1}));
  ASSERT_TRUE(parse_host_port("h:65535", &hp).is_ok());
  EXPECT_EQ(hp.port, 65535);

  ASSERT_TRUE(parse_host_port("[fd00::5]:8000", &hp).is_ok());
  EXPECT_EQ(hp.host, "fd00::5");
  EXPECT_TRUE(hp.is_ipv6());
  EXPECT_EQ(hp.to_string(), "[fd00::5]:8000");
}

TEST(ParseHostPort, RejectsEachBadForm) {
  HostPort hp;
  EXPECT_TRUE(BadAddress(parse_host_port("", &hp), "address is empty"));
  EXPECT_TRUE(BadAddress(parse_host_port("127.0.10.5", &hp), "missing ':port'"));
  EXPECT_TRUE(BadAddress(parse_host_port("127.0.10.5:", &hp), "port is empty"));
  EXPECT_TRUE(BadAddress(parse_host_port(":8000", &hp), "host is empty"));
  EXPECT_TRUE(BadAddress(parse_host_port("127.0.10.5:0", &hp), "port '0' is out of range 1..65535"));
  EXPECT_TRUE(BadAddress(parse_host_port("127.0.10.5:70000", &hp), "port '70000' is out of range"));
  EXPECT_TRUE(BadAddress(parse_host_port("127.0.10.5:99999999999999999999", &hp), "out of range"));
  EXPECT_TRUE(BadAddress(parse_host_port("127.0.10.5:80a", &hp), "port '80a' is not a number"));
  EXPECT_TRUE(BadAddress(parse_host_port("127.0.10.5:-80", &hp), "is not a number"));
  EXPECT_TRUE(BadAddress(parse_host_port("http://127.0.10.5:8000", &hp), "scheme"));
  EXPECT_TRUE(BadAddress(parse_host_port("127.0.10.5:8000/v1", &hp), "has a path"));
  EXPECT_TRUE(BadAddress(parse_host_port("fd00::5:8000", &hp), "must be in brackets"));
  EXPECT_TRUE(BadAddress(parse_host_port("[fd00::5]8000", &hp), "missing ':port' after"));
  EXPECT_TRUE(BadAddress(parse_host_port("[fd00::5]", &hp), "missing ':port' after"));
  EXPECT_TRUE(BadAddress(parse_host_port("[fd00::5:8000", &hp), "closing ']'"));
  EXPECT_TRUE(BadAddress(parse_host_port("[zz::1]:80", &hp), "not a valid IPv6"));
  EXPECT_TRUE(BadAddress(parse_host_port("127.0.10.5\0:80"s, &hp), "character outside"));
  EXPECT_TRUE(BadAddress(parse_host_port("300.0.0.5:80", &hp), "above 255"));
}

// ---- parse_http_url ----

TEST(ParseHttpUrl, AcceptsHttpUrls) {
  HttpUrl url;
  ASSERT_TRUE(parse_http_url("http://127.0.10.5:8000/v1/completions", &url).is_ok());
  EXPECT_EQ(url.address, (HostPort{"127.0.10.5", 8000}));
  EXPECT_EQ(url.path, "/v1/completions");

  ASSERT_TRUE(parse_http_url("http://node:8000", &url).is_ok());
  EXPECT_EQ(url.path, "");
  ASSERT_TRUE(parse_http_url("HTTP://node:8000/", &url).is_ok());
  EXPECT_EQ(url.path, "/");
  ASSERT_TRUE(parse_http_url("http://[fd00::5]:8000/v1", &url).is_ok());
  EXPECT_EQ(url.address, (HostPort{"fd00::5", 8000}));
}

TEST(ParseHttpUrl, RejectsOtherSchemesAndBadAuthorities) {
  HttpUrl url;
  EXPECT_TRUE(BadAddress(parse_http_url("https://h:1/", &url), "scheme 'https' is not supported"));
  EXPECT_TRUE(BadAddress(parse_http_url("127.0.10.5:8000/v1", &url), "missing the 'http://'"));
  EXPECT_TRUE(BadAddress(parse_http_url("http://h/v1", &url), "missing ':port'"));
  EXPECT_TRUE(BadAddress(parse_http_url("http://u@h:1/", &url), "user info"));
  EXPECT_TRUE(BadAddress(parse_http_url("http://h:1/a b", &url), "space or control"));
  EXPECT_TRUE(BadAddress(parse_http_url("http://h:0/", &url), "out of range"));
  EXPECT_TRUE(BadAddress(parse_http_url("http://", &url), "address is empty"));
}

// ---- MoRIIO ZMQ address ----

TEST(ParseMoriioZmqAddress, AcceptsVllmFormAnyOrderAndIpv6) {
  MoriioZmqAddress zmq;
  ASSERT_TRUE(parse_moriio_zmq_address("host:127.0.10.5,handshake:6301,notify:61005", &zmq).is_ok());
  EXPECT_EQ(zmq, (MoriioZmqAddress{"127.0.10.5", 6301, 61005}));
  EXPECT_EQ(zmq.to_string(), "host:127.0.10.5,handshake:6301,notify:61005");

  ASSERT_TRUE(parse_moriio_zmq_address("notify:2,host:node-1,handshake:1", &zmq).is_ok());
  EXPECT_EQ(zmq, (MoriioZmqAddress{"node-1", 1, 2}));

  // Split on the first ':' of each segment, so a bare IPv6 host survives.
  ASSERT_TRUE(parse_moriio_zmq_address("host:fd00::1,handshake:6301,notify:61005", &zmq).is_ok());
  EXPECT_EQ(zmq.host, "fd00::1");
  EXPECT_EQ(zmq.to_string(), "host:fd00::1,handshake:6301,notify:61005");
}

TEST(ParseMoriioZmqAddress, RejectsEachBadForm) {
  MoriioZmqAddress zmq;
  EXPECT_TRUE(BadAddress(parse_moriio_zmq_address("", &zmq), "address is empty"));
  EXPECT_TRUE(BadAddress(parse_moriio_zmq_address("host:1.2.3.4,handshake:1", &zmq),
                         "missing the 'notify' key"));
  EXPECT_TRUE(
      BadAddress(parse_moriio_zmq_address("handshake:1,notify:2", &zmq), "missing the 'host' key"));
  EXPECT_TRUE(BadAddress(parse_moriio_zmq_address("host:1.2.3.4,notify:2", &zmq),
                         "missing the 'handshake' key"));
  EXPECT_TRUE(BadAddress(parse_moriio_zmq_address("host:h,handshake:1,notify:2,rank:0", &zmq),
                         "unknown key 'rank'"));
  EXPECT_TRUE(BadAddress(parse_moriio_zmq_address("host:h,host:g,handshake:1,notify:2", &zmq),
                         "key 'host' appears twice"));
  EXPECT_TRUE(
      BadAddress(parse_moriio_zmq_address("host:,handshake:1,notify:2", &zmq), "host is empty"));
  EXPECT_TRUE(BadAddress(parse_moriio_zmq_address("host:1.2.3.4,handshake:x,notify:5", &zmq),
                         "handshake port 'x' is not a number"));
  EXPECT_TRUE(BadAddress(parse_moriio_zmq_address("host:h,handshake:1,notify:0", &zmq),
                         "notify port '0' is out of range"));
  EXPECT_TRUE(BadAddress(parse_moriio_zmq_address("host:h,handshake:1,notify:2,", &zmq),
                         "segment '' has no ':'"));
  EXPECT_TRUE(BadAddress(parse_moriio_zmq_address("host:h,handshake,notify:2", &zmq),
                         "segment 'handshake' has no ':'"));
  EXPECT_TRUE(BadAddress(parse_moriio_zmq_address("host:bad host,handshake:1,notify:2", &zmq),
                         "character outside"));
  EXPECT_TRUE(
      BadAddress(parse_moriio_zmq_address("127.0.10.5:6301", &zmq), "unknown key '127.0.10.5'"));
}

TEST(LooksLikeMoriioZmqAddress, TellsMoriioFromPlainHostPort) {
  EXPECT_TRUE(looks_like_moriio_zmq_address("host:127.0.10.5,handshake:6301,notify:61005"));
  EXPECT_TRUE(looks_like_moriio_zmq_address("notify:1,handshake:2,host:h"));
  EXPECT_TRUE(looks_like_moriio_zmq_address("host:h"));
  EXPECT_FALSE(looks_like_moriio_zmq_address("127.0.10.6:21001"));
  EXPECT_FALSE(looks_like_moriio_zmq_address("hostname:21001"));
  EXPECT_FALSE(looks_like_moriio_zmq_address(""));
}

TEST(SameHost, ComparesWithoutALookup) {
  EXPECT_TRUE(names_loopback("127.0.0.1"));
  EXPECT_TRUE(names_loopback("127.9.9.9"));
  EXPECT_TRUE(names_loopback("::1"));
  EXPECT_TRUE(names_loopback("[::1]"));
  EXPECT_TRUE(names_loopback("::ffff:127.0.0.2"));
  EXPECT_TRUE(names_loopback("localhost"));
  EXPECT_TRUE(names_loopback("LOCALHOST."));
  EXPECT_TRUE(names_loopback("node-1.localhost"));
  EXPECT_FALSE(names_loopback("localhost.invalid"));
  EXPECT_FALSE(names_loopback("notlocalhost"));
  EXPECT_FALSE(names_loopback(".localhost"));
  EXPECT_FALSE(names_loopback("fd00::1"));
  EXPECT_FALSE(names_loopback(""));

  EXPECT_TRUE(same_host("127.0.0.1", "localhost"));
  EXPECT_TRUE(same_host("127.0.0.1", "127.0.0.7"));
  EXPECT_TRUE(same_host("fd00::1", "[fd00:0:0::1]"));
  EXPECT_TRUE(same_host("node-a.invalid", "NODE-A.invalid."));
  EXPECT_FALSE(same_host("node-a.invalid", "node-b.invalid"));
  EXPECT_FALSE(same_host("fd00::1", "fd00::2"));
  EXPECT_FALSE(same_host("127.0.0.1", "node-a.invalid"));
  EXPECT_FALSE(same_host("localhost", "fd00::1"));
  EXPECT_FALSE(same_host("", ""));
}

// A side channel another node connects to: the owner's host, or loopback on one machine.
TEST(SameHost, SideChannelHostIsTheOwnersOrLoopbackOnOneMachine) {
  EXPECT_TRUE(side_channel_host_ok("node-a.invalid", "NODE-A.invalid", "node-b.invalid"));
  EXPECT_TRUE(side_channel_host_ok("localhost", "node-a.invalid", "node-a.invalid"));
  EXPECT_TRUE(side_channel_host_ok("127.0.0.1", "127.0.0.5", "node-b.invalid"));  // owner on loopback
  EXPECT_FALSE(side_channel_host_ok("localhost", "node-a.invalid", "node-b.invalid"));
  EXPECT_FALSE(side_channel_host_ok("node-b.invalid", "node-a.invalid", "node-b.invalid"));
  EXPECT_FALSE(side_channel_host_ok("victim.invalid", "node-a.invalid", "node-a.invalid"));
}

}  // namespace
}  // namespace pdr::proto
