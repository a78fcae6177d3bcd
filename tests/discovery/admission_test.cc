// Pure admission rules: CIDR allow lists, "a node may register only itself", the ZAP decision and
// CURVE key files. The real sockets are in discovery_service_test.cc.
//
// Addresses outside 127.0.0.0/8 below are from RFC 5737's documentation ranges and only ever fed
// to these pure functions: nothing here registers them or sends them traffic.
#include <gtest/gtest.h>
#include <zmq.h>

#include "discovery/config/admission.h"
#include "proto/curve_keys.h"
#include "discovery/zap_policy.h"

namespace pdr::discovery {
namespace {

config::IpAddress ip(std::string_view text) {
  auto a = config::parse_ip_address(text);
  EXPECT_TRUE(a.has_value()) << text;
  return a.value_or(config::IpAddress{});
}

config::Cidr cidr(std::string_view text) {
  config::Cidr c;
  Status s = config::parse_cidr(text, &c);
  EXPECT_TRUE(s.is_ok()) << text << ": " << s.to_string();
  return c;
}

TEST(Cidr, ParsesAndMatchesV4AndV6) {
  EXPECT_TRUE(cidr("127.0.0.0/8").contains(ip("127.9.8.7")));
  EXPECT_FALSE(cidr("127.0.0.0/8").contains(ip("128.0.0.1")));  // first past /8; only parsed
  EXPECT_TRUE(cidr("127.0.0.7").contains(ip("127.0.0.7")));  // bare address: /32
  EXPECT_FALSE(cidr("127.0.0.7").contains(ip("127.0.0.8")));
  EXPECT_TRUE(cidr("127.0.0.0/31").contains(ip("127.0.0.1")));
  EXPECT_FALSE(cidr("127.0.0.0/31").contains(ip("127.0.0.2")));
  EXPECT_TRUE(cidr("::1/128").contains(ip("::1")));
  EXPECT_TRUE(cidr("::1/128").contains(ip("[::1]")));
  EXPECT_FALSE(cidr("::1/128").contains(ip("127.0.0.1")));  // families never mix
  // A dual-stack socket reports an IPv4 peer as ::ffff:a.b.c.d.
  EXPECT_TRUE(cidr("127.0.0.0/8").contains(ip("::ffff:127.0.0.1")));
  EXPECT_TRUE(cidr("0.0.0.0/0").matches_everything());
  EXPECT_EQ(cidr("127.0.0.0/8").to_string(), "127.0.0.0/8");
}

TEST(Cidr, RefusesWhatIsNotOne) {
  config::Cidr c;
  for (std::string_view bad : {"", "localhost", "127.0.0.0/", "127.0.0.0/33", "::1/129", "127.0.0.0/8x",
                               "127.0.0.0/-1", "1.2.3.4.5", "/8"}) {
    EXPECT_FALSE(config::parse_cidr(bad, &c).is_ok()) << bad;
  }
  const Status s = config::parse_cidr("127.1.2.3/8", &c);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("did you mean 127.0.0.0/8"), std::string::npos) << s.message();
}

TEST(AllowList, DefaultIsThisMachineOnly) {
  config::AllowList loopback;
  loopback.cidrs = {cidr("127.0.0.0/8"), cidr("::1/128")};
  EXPECT_TRUE(loopback.contains(ip("127.0.0.1")));
  EXPECT_TRUE(loopback.contains(ip("::1")));
  EXPECT_FALSE(loopback.contains(ip("192.0.2.10")));
  EXPECT_FALSE(loopback.matches_everything());
  loopback.cidrs.push_back(cidr("::/0"));
  EXPECT_TRUE(loopback.matches_everything());
}

TEST(CheckRegisteredAddress, UnauthenticatedSendersSpeakOnlyForThemselves) {
  using config::AddressCheck;
  using config::AdmissionClass;
  const auto peer = config::parse_ip_address("192.0.2.10");
  auto check = [](AdmissionClass c, const std::optional<config::IpAddress>& p, std::string_view host) {
    return config::check_registered_address(c, p, host);
  };
  EXPECT_EQ(check(AdmissionClass::kAddress, peer, "192.0.2.10"), AddressCheck::kOwn);
  EXPECT_EQ(check(AdmissionClass::kAddress, peer, "192.0.2.11"), AddressCheck::kNotOwn);
  EXPECT_EQ(check(AdmissionClass::kOpen, peer, "127.0.0.1"), AddressCheck::kNotOwn);
  // Authenticated senders (a sidecar may register the vLLM server beside it) may name any host.
  EXPECT_EQ(check(AdmissionClass::kToken, peer, "192.0.2.11"), AddressCheck::kOwn);
  EXPECT_EQ(check(AdmissionClass::kCurve, peer, "192.0.2.11"), AddressCheck::kOwn);
  EXPECT_EQ(check(AdmissionClass::kToken, peer, "node-7.example"), AddressCheck::kOwn);
  // A name is the DNS server's word, not the sender's proof: refused from unauthenticated
  // senders, whatever it would resolve to (nothing is resolved), from any peer.
  EXPECT_EQ(check(AdmissionClass::kAddress, peer, "node-7.example"), AddressCheck::kHostName);
  EXPECT_EQ(check(AdmissionClass::kOpen, peer, "victim.invalid"), AddressCheck::kHostName);
  EXPECT_EQ(check(AdmissionClass::kAddress, config::parse_ip_address("127.0.0.1"), "victim.invalid"),
            AddressCheck::kHostName);
  // ipc:// peers have no address: the same machine.
  EXPECT_EQ(check(AdmissionClass::kAddress, std::nullopt, "192.0.2.11"), AddressCheck::kOwn);
  // One machine: every loopback address is the same host, and "localhost" names loopback
  // without a lookup (RFC 6761), so it is a loopback peer's own host and nobody else's.
  const auto lo = config::parse_ip_address("127.0.0.1");
  EXPECT_EQ(check(AdmissionClass::kAddress, lo, "127.0.0.5"), AddressCheck::kOwn);
  EXPECT_EQ(check(AdmissionClass::kAddress, config::parse_ip_address("::ffff:127.0.0.1"), "127.0.0.1"),
            AddressCheck::kOwn);
  EXPECT_EQ(check(AdmissionClass::kAddress, lo, "localhost"), AddressCheck::kOwn);
  EXPECT_EQ(check(AdmissionClass::kAddress, lo, "LocalHost."), AddressCheck::kOwn);
  EXPECT_EQ(check(AdmissionClass::kAddress, lo, "node.localhost"), AddressCheck::kOwn);
  EXPECT_EQ(check(AdmissionClass::kAddress, peer, "localhost"), AddressCheck::kNotOwn);
  EXPECT_EQ(check(AdmissionClass::kAddress, lo, "localhost.invalid"), AddressCheck::kHostName);
  EXPECT_EQ(check(AdmissionClass::kAddress, lo, "notlocalhost"), AddressCheck::kHostName);
}

proto::Registration moriio_registration(std::string http_host, std::string zmq_host) {
  proto::Registration reg;
  reg.http_address = {std::move(http_host), 8000};
  reg.moriio_zmq = proto::MoriioZmqAddress{std::move(zmq_host), 6301, 61005};
  return reg;
}

TEST(FindForeignAddress, ChecksEveryAddressARegistrationNames) {
  using config::AddressCheck;
  const auto lo = config::parse_ip_address("127.0.0.1");
  const auto cls = config::AdmissionClass::kAddress;
  EXPECT_FALSE(config::find_foreign_address(cls, lo, moriio_registration("127.0.0.1", "127.0.0.2")));
  // The MoRIIO side channel host: the paired node connects there.
  auto found = config::find_foreign_address(cls, lo, moriio_registration("127.0.0.1", "victim.invalid"));
  ASSERT_TRUE(found);
  EXPECT_EQ(found->field, "zmq_address");
  EXPECT_EQ(found->host, "victim.invalid");
  EXPECT_EQ(found->check, AddressCheck::kHostName);
  // The http_address comes first.
  found = config::find_foreign_address(cls, lo, moriio_registration("db.invalid", "victim.invalid"));
  ASSERT_TRUE(found);
  EXPECT_EQ(found->field, "http_address");
  // P2P-NCCL's host:port zmq_address.
  proto::Registration p2p;
  p2p.http_address = {"127.0.0.1", 8000};
  p2p.kv_address = proto::HostPort{"192.0.2.7", 14579};
  found = config::find_foreign_address(cls, lo, p2p);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->field, "zmq_address");
  EXPECT_EQ(found->check, AddressCheck::kNotOwn);
  // Both KV events endpoints (the router's SUB sockets connect there).
  proto::Registration kv;
  kv.http_address = {"127.0.0.1", 8000};
  kv.kv_events_endpoint = proto::HostPort{"localhost", 5557};
  kv.kv_events_replay_endpoint = proto::HostPort{"kv-victim.invalid", 5558};
  found = config::find_foreign_address(cls, lo, kv);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->field, "kv_events_replay_endpoint");
  EXPECT_EQ(found->check, AddressCheck::kHostName);
  // Authenticated senders may name any of them.
  EXPECT_FALSE(config::find_foreign_address(config::AdmissionClass::kCurve, lo, kv));
  EXPECT_FALSE(config::find_foreign_address(config::AdmissionClass::kToken, lo,
                                            moriio_registration("db.invalid", "victim.invalid")));
}

std::vector<std::string> zap_request(std::string domain, std::string address, std::string mechanism,
                                     std::string credential = "") {
  std::vector<std::string> frames = {"1.0", "7", std::move(domain), std::move(address), "", std::move(mechanism)};
  if (!credential.empty()) frames.push_back(std::move(credential));
  return frames;
}

// Handshakes libzmq fails before it asks the ZAP handler, read from the sockets' monitors.
TEST(ZapPolicy, HandshakeFailuresBeforeZapCountAsRefusals) {
  EXPECT_EQ(handshake_failure_refusal(ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH), HandshakeRefusal::kWrongMechanism);
  EXPECT_EQ(handshake_failure_refusal(ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC), HandshakeRefusal::kWrongServerKey);
  EXPECT_EQ(handshake_failure_refusal(ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_HELLO), HandshakeRefusal::kProtocolError);
  EXPECT_EQ(handshake_failure_refusal(0), HandshakeRefusal::kProtocolError);
  EXPECT_EQ(to_string(HandshakeRefusal::kWrongServerKey), "wrong_server_key");
  EXPECT_EQ(to_string(HandshakeRefusal::kProtocolError), "protocol_error");
}

TEST(ZapPolicy, PlainEndpointAdmitsByAddress) {
  ZapPolicy policy;
  policy.allowed_peers.cidrs = {cidr("127.0.0.7/32")};
  ZapDecision d = decide_zap(policy, zap_request("pdr-plain", "127.0.0.7", "NULL"));
  EXPECT_TRUE(d.allow);
  EXPECT_EQ(user_id_class(d.user_id, policy.address_class()), config::AdmissionClass::kAddress);
  d = decide_zap(policy, zap_request("pdr-plain", "127.0.0.1", "NULL"));
  EXPECT_FALSE(d.allow);
  EXPECT_EQ(d.refusal, HandshakeRefusal::kAddressNotAllowed);
  EXPECT_EQ(decide_zap(policy, zap_request("pdr-plain", "127.0.0.7", "PLAIN")).refusal,
            HandshakeRefusal::kWrongMechanism);
  EXPECT_EQ(decide_zap(policy, {"1.0", "7"}).refusal, HandshakeRefusal::kMalformed);
  EXPECT_EQ(decide_zap(policy, zap_request("other", "127.0.0.7", "NULL")).refusal, HandshakeRefusal::kMalformed);
  const auto reply = zap_reply("7", d);
  EXPECT_EQ(reply[0], "1.0");
  EXPECT_EQ(reply[1], "7");
  EXPECT_EQ(reply[2], "400");
  policy.allowed_peers.cidrs.push_back(cidr("0.0.0.0/0"));
  EXPECT_EQ(policy.address_class(), config::AdmissionClass::kOpen);
}

TEST(ZapPolicy, CurveEndpointAdmitsListedKeysFromAnywhere) {
  proto::CurveKeyPair client, other;
  ASSERT_TRUE(proto::generate_curve_key_pair(&client).is_ok());
  ASSERT_TRUE(proto::generate_curve_key_pair(&other).is_ok());
  auto raw = [](const std::string& z85) {
    std::string bytes(32, '\0');
    EXPECT_NE(zmq_z85_decode(reinterpret_cast<uint8_t*>(bytes.data()), z85.c_str()), nullptr);
    return bytes;
  };
  EXPECT_EQ(proto::curve_key_z85(raw(client.public_z85)), client.public_z85);
  ZapPolicy policy;  // no allowed peers at all: keys alone decide
  policy.allowed_client_keys = {client.public_z85};
  ZapDecision d = decide_zap(policy, zap_request("pdr-curve", "127.0.0.1", "CURVE", raw(client.public_z85)));
  ASSERT_TRUE(d.allow) << d.status_text;
  EXPECT_EQ(user_id_class(d.user_id, config::AdmissionClass::kAddress), config::AdmissionClass::kCurve);
  d = decide_zap(policy, zap_request("pdr-curve", "127.0.0.1", "CURVE", raw(other.public_z85)));
  EXPECT_FALSE(d.allow);
  EXPECT_EQ(d.refusal, HandshakeRefusal::kKeyNotAllowed);
  EXPECT_EQ(decide_zap(policy, zap_request("pdr-curve", "127.0.0.1", "NULL")).refusal,
            HandshakeRefusal::kWrongMechanism);
  // Without a key list, CURVE only encrypts: the address decides and the class stays "address".
  policy.allowed_client_keys.clear();
  policy.allowed_peers.cidrs = {cidr("127.0.0.0/8")};
  d = decide_zap(policy, zap_request("pdr-curve", "127.0.0.1", "CURVE", raw(other.public_z85)));
  ASSERT_TRUE(d.allow);
  EXPECT_EQ(user_id_class(d.user_id, policy.address_class()), config::AdmissionClass::kAddress);
}

TEST(CurveKeys, CertificateRoundTripAndBareKeys) {
  proto::CurveKeyPair keys;
  ASSERT_TRUE(proto::generate_curve_key_pair(&keys).is_ok());
  proto::CurveKeyPair parsed;
  ASSERT_TRUE(proto::parse_curve_secret_key(proto::curve_certificate(keys, true), &parsed).is_ok());
  EXPECT_EQ(parsed.public_z85, keys.public_z85);  // derived from the secret
  EXPECT_EQ(parsed.secret_z85, keys.secret_z85);
  ASSERT_TRUE(proto::parse_curve_secret_key(keys.secret_z85 + "\n", &parsed).is_ok());
  EXPECT_EQ(parsed.public_z85, keys.public_z85);
  std::string pub;
  ASSERT_TRUE(proto::parse_curve_public_key(proto::curve_certificate(keys, false), &pub).is_ok());
  EXPECT_EQ(pub, keys.public_z85);
  // The public certificate has no secret in it.
  EXPECT_EQ(proto::curve_certificate(keys, false).find(keys.secret_z85), std::string::npos);
  EXPECT_FALSE(proto::parse_curve_secret_key(proto::curve_certificate(keys, false), &parsed).is_ok());
}

TEST(CurveKeys, KeyListsAndBadFiles) {
  proto::CurveKeyPair a, b;
  ASSERT_TRUE(proto::generate_curve_key_pair(&a).is_ok());
  ASSERT_TRUE(proto::generate_curve_key_pair(&b).is_ok());
  std::vector<std::string> keys;
  ASSERT_TRUE(proto::parse_curve_public_keys("# sidecars\n" + a.public_z85 + "\n\n" + proto::curve_certificate(b, false) +
                                          a.public_z85 + "\n",
                                      &keys)
                  .is_ok());
  EXPECT_EQ(keys.size(), 2u);  // duplicates dropped
  EXPECT_FALSE(proto::parse_curve_public_keys("not a key, but exactly forty characters!\n", &keys).is_ok());
  std::string pub;
  const Status s = proto::parse_curve_public_key("", &pub);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("no CURVE key"), std::string::npos);
  proto::CurveKeyPair kp;
  EXPECT_FALSE(proto::parse_curve_secret_key(std::string(40, '~'), &kp).is_ok());
}

}  // namespace
}  // namespace pdr::discovery
