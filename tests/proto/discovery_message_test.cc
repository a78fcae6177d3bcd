#include "proto/discovery_message.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <msgpack.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/hex.h"
#include "tests/support/source_path.h"

namespace pdr::proto {
namespace {

// Addresses: IPv4 ones are in 127.0.0.0/8. The IPv6 ones (fd00::/8) are not ::1 because the IPv6
// forms are what is checked (groups, brackets, zone ids), and they are only decoded and
// encoded here: nothing connects to them.

using pdr::test::from_hex;
using pdr::test::to_hex;

// ---- Vectors: /usr/bin/python3 tests/fuzz/make_corpus.py --hex (msgpack.packb of the dicts vLLM
// builds, docs/design/wire-formats.md sections 1 and 2). ----

// {type:"P", http_address:"127.0.10.5:8000",
//  zmq_address:"host:127.0.10.5,handshake:6301,notify:61005", dp_size:2, tp_size:8, transfer_mode:"READ"}
constexpr std::string_view kMoriioCurrentHex =
    "86a474797065a150ac687474705f61646472657373af3132372e302e31302e353a38303030ab7a6d715f6164647265"
    "7373d92b686f73743a3132372e302e31302e352c68616e647368616b653a363330312c6e6f746966793a3631303035"
    "a764705f73697a6502a774705f73697a6508ad7472616e736665725f6d6f6465a452454144";
// {type:"register", role:"P", index:"7", request_address:"http://127.0.10.5:8000/v1/completions",
//  handshake_port:6301, notify_port:61005, dp_size:1, tp_size:4, transfer_mode:"WRITE"}
constexpr std::string_view kMoriioLegacyHex =
    "89a474797065a87265676973746572a4726f6c65a150a5696e646578a137af726571756573745f61646472657373d9"
    "25687474703a2f2f3132372e302e31302e353a383030302f76312f636f6d706c6574696f6e73ae68616e647368616b"
    "655f706f7274cd189dab6e6f746966795f706f7274cdee4da764705f73697a6501a774705f73697a6504ad7472616e"
    "736665725f6d6f6465a55752495445";
// {type:"D", http_address:"127.0.10.6:8100", zmq_address:"127.0.10.6:21001"}
constexpr std::string_view kP2pNcclHex =
    "83a474797065a144ac687474705f61646472657373af3132372e302e31302e363a38313030ab7a6d715f6164647265"
    "7373b03132372e302e31302e363a3231303031";
// {type:"HELLO"}
constexpr std::string_view kHelloHex = "81a474797065a548454c4c4f";
// {type:"D", http_address:"[fd00::6]:8200", zmq_address:"host:fd00::6,handshake:6301,notify:61005",
//  dp_size:1, tp_size:1, transfer_mode:"write"}
constexpr std::string_view kMoriioIpv6Hex =
    "86a474797065a144ac687474705f61646472657373ae5b666430303a3a365d3a38323030ab7a6d715f616464726573"
    "73d928686f73743a666430303a3a362c68616e647368616b653a363330312c6e6f746966793a3631303035a764705f"
    "73697a6501a774705f73697a6501ad7472616e736665725f6d6f6465a57772697465";
// pdrouter registration with every extension key (see make_corpus.py "pdrouter_full").
constexpr std::string_view kPdrouterFullHex =
    "de0011a474797065a150ac687474705f61646472657373b36e6f64652d332e6578616d706c653a38303030ab7a6d71"
    "5f61646472657373d92b686f73743a3132372e302e31302e372c68616e647368616b653a363330312c6e6f74696679"
    "3a3631303035a764705f73697a6504a774705f73697a6502ad7472616e736665725f6d6f6465a452454144a5706472"
    "5f7601a9636f6e6e6563746f72a66d6f7269696fab696e7374616e63655f6964ab6e6f64652d332d61316232a56570"
    "6f6368cf0000018bcfe5687ba56d6f64656cd9206d6574612d6c6c616d612f4c6c616d612d332e312d38422d496e73"
    "7472756374ae626f6f7473747261705f706f7274cd2326a66c6162656c7382a47261636ba27231a3677075a66d6933"
    "303078a46c6f616483a772756e6e696e6703a777616974696e6701ae667265655f6b765f626c6f636b73cd1000a864"
    "7261696e696e67c3a674746c5f6d73cd2328a461757468a6733363726574";
// {type:"HELLO", pdr_v:1, role:"decode", http_address:"127.0.10.8:8000", connector:"nixl"}
constexpr std::string_view kPdrouterHelloHex =
    "85a474797065a548454c4c4fa57064725f7601a4726f6c65a66465636f6465ac687474705f61646472657373af3132"
    "372e302e31302e383a38303030a9636f6e6e6563746f72a46e69786c";
// {type:"goodbye", pdr_v:1, http_address:"127.0.10.5:8000", instance_id:"node-3-a1b2", epoch:42,
//  auth:"s3cret"}
constexpr std::string_view kGoodbyeHex =
    "86a474797065a7676f6f64627965a57064725f7601ac687474705f61646472657373af3132372e302e31302e353a38"
    "303030ab696e7374616e63655f6964ab6e6f64652d332d61316232a565706f63682aa461757468a6733363726574";
// {type:"ack", pdr_v:1, ok:True, reason:"", ttl_ms:9000, registry_version:17}
constexpr std::string_view kAckHex =
    "86a474797065a361636ba57064725f7601a26f6bc3a6726561736f6ea0a674746c5f6d73cd2328b072656769737472"
    "795f76657273696f6e11";

// ---- Packed msgpack values, for building messages key by key ----

struct Buffer {
  std::string data;
  void write(const char* bytes, size_t size) { data.append(bytes, size); }
};

template <typename Fn>
std::string packed(Fn&& fn) {
  Buffer buffer;
  msgpack::packer<Buffer> packer(buffer);
  fn(packer);
  return buffer.data;
}

std::string str_value(std::string_view s) {
  return packed([&](auto& p) {
    p.pack_str(static_cast<uint32_t>(s.size()))
        .pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
  });
}
std::string uint_value(uint64_t v) {
  return packed([&](auto& p) { p.pack_uint64(v); });
}
std::string int_value(int64_t v) {
  return packed([&](auto& p) { p.pack_int64(v); });
}
// Written by hand: msgpack-cxx's pack_double packs integral values as ints, Python never does.
std::string double_value(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  std::string out(1, '\xcb');
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<char>(bits >> shift));
  return out;
}
std::string bool_value(bool v) {
  return packed([&](auto& p) { v ? p.pack_true() : p.pack_false(); });
}
std::string nil_value() {
  return packed([&](auto& p) { p.pack_nil(); });
}
std::string array_value(uint32_t n) {
  return packed([&](auto& p) { p.pack_array(n); }) + std::string(n, '\x01');
}

// A msgpack map assembled from (key, packed value) pairs, so tests can drop, replace, duplicate
// and mistype single keys of a known-good message.
class MessageBuilder {
 public:
  MessageBuilder& set(std::string_view key, std::string value) {
    for (auto& [k, v] : entries_) {
      if (k == key) {
        v = std::move(value);
        return *this;
      }
    }
    entries_.emplace_back(std::string(key), std::move(value));
    return *this;
  }
  MessageBuilder& erase(std::string_view key) {
    std::erase_if(entries_, [&](const auto& entry) { return entry.first == key; });
    return *this;
  }
  MessageBuilder& append(std::string_view key, std::string value) {
    entries_.emplace_back(std::string(key), std::move(value));
    return *this;
  }
  std::string bytes() const {
    std::string out = packed([&](auto& p) { p.pack_map(static_cast<uint32_t>(entries_.size())); });
    for (const auto& [k, v] : entries_) out += str_value(k) + v;
    return out;
  }
  // As a nested map value.
  std::string value() const { return bytes(); }

 private:
  std::vector<std::pair<std::string, std::string>> entries_;
};

MessageBuilder moriio_current() {
  return MessageBuilder()
      .set("type", str_value("P"))
      .set("http_address", str_value("127.0.10.5:8000"))
      .set("zmq_address", str_value("host:127.0.10.5,handshake:6301,notify:61005"))
      .set("dp_size", uint_value(2))
      .set("tp_size", uint_value(8))
      .set("transfer_mode", str_value("READ"));
}

MessageBuilder moriio_legacy() {
  return MessageBuilder()
      .set("type", str_value("register"))
      .set("role", str_value("P"))
      .set("index", str_value("7"))
      .set("request_address", str_value("http://127.0.10.5:8000/v1/completions"))
      .set("handshake_port", uint_value(6301))
      .set("notify_port", uint_value(61005))
      .set("dp_size", uint_value(1))
      .set("tp_size", uint_value(4))
      .set("transfer_mode", str_value("WRITE"));
}

MessageBuilder p2p_nccl() {
  return MessageBuilder()
      .set("type", str_value("D"))
      .set("http_address", str_value("127.0.10.6:8100"))
      .set("zmq_address", str_value("127.0.10.6:21001"));
}

MessageBuilder pdrouter_minimal() {
  return MessageBuilder()
      .set("type", str_value("P"))
      .set("http_address", str_value("127.0.10.7:8000"))
      .set("pdr_v", uint_value(1));
}

MessageBuilder goodbye() {
  return MessageBuilder()
      .set("type", str_value("goodbye"))
      .set("pdr_v", uint_value(1))
      .set("http_address", str_value("127.0.10.5:8000"));
}

Status decode(std::string_view bytes, DiscoveryMessage* out, const DecodeLimits& limits = {}) {
  return decode_discovery_message(as_bytes(bytes), limits, out);
}

Registration decode_registration(std::string_view bytes) {
  DiscoveryMessage message;
  const Status status = decode(bytes, &message);
  EXPECT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(message.kind, DiscoveryMessage::Kind::kRegistration);
  return message.registration;
}

::testing::AssertionResult FailsWith(std::string_view bytes, StatusCode code,
                                     std::string_view substring, const DecodeLimits& limits = {}) {
  DiscoveryMessage message;
  const Status status = decode(bytes, &message, limits);
  if (status.code() != code) {
    return ::testing::AssertionFailure()
           << "expected " << code_label(code) << ", got " << status.to_string();
  }
  if (status.message().find(substring) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "message '" << status.message() << "' lacks '" << substring << "'";
  }
  return ::testing::AssertionSuccess();
}

// ---- The three vLLM dialects, byte-exact both ways ----

TEST(DiscoveryVectors, MoriioCurrentDecodes) {
  const Registration reg = decode_registration(from_hex(kMoriioCurrentHex));
  EXPECT_EQ(reg.format, RegistrationFormat::kMoriio);
  EXPECT_EQ(reg.connector, Connector::kMoriio);
  EXPECT_EQ(reg.role, Role::kPrefill);
  EXPECT_EQ(reg.http_address, (HostPort{"127.0.10.5", 8000}));
  EXPECT_EQ(reg.zmq_address, "host:127.0.10.5,handshake:6301,notify:61005");
  ASSERT_TRUE(reg.moriio_zmq.has_value());
  EXPECT_EQ(*reg.moriio_zmq, (MoriioZmqAddress{"127.0.10.5", 6301, 61005}));
  EXPECT_FALSE(reg.kv_address.has_value());
  EXPECT_EQ(reg.dp_size, 2u);
  EXPECT_EQ(reg.tp_size, 8u);
  EXPECT_EQ(reg.transfer_mode, TransferMode::kRead);
  EXPECT_EQ(reg.schema_version, 0u);
}

TEST(DiscoveryVectors, MoriioCurrentEncodesByteExact) {
  const std::string bytes = from_hex(kMoriioCurrentHex);
  EXPECT_EQ(to_hex(encode_registration(decode_registration(bytes))), kMoriioCurrentHex);
  EXPECT_EQ(moriio_current().bytes(), bytes) << "test builder must match Python's packing";
}

TEST(DiscoveryVectors, MoriioLegacyDecodes) {
  const Registration reg = decode_registration(from_hex(kMoriioLegacyHex));
  EXPECT_EQ(reg.format, RegistrationFormat::kMoriioLegacy);
  EXPECT_EQ(reg.connector, Connector::kMoriio);
  EXPECT_EQ(reg.role, Role::kPrefill);
  EXPECT_EQ(reg.legacy_index, "7");
  EXPECT_EQ(reg.http_address, (HostPort{"127.0.10.5", 8000}));
  ASSERT_TRUE(reg.moriio_zmq.has_value());
  EXPECT_EQ(*reg.moriio_zmq, (MoriioZmqAddress{"127.0.10.5", 6301, 61005}));
  EXPECT_EQ(reg.zmq_address, "host:127.0.10.5,handshake:6301,notify:61005");
  EXPECT_EQ(reg.dp_size, 1u);
  EXPECT_EQ(reg.tp_size, 4u);
  EXPECT_EQ(reg.transfer_mode, TransferMode::kWrite);
}

TEST(DiscoveryVectors, MoriioLegacyEncodesByteExact) {
  const std::string bytes = from_hex(kMoriioLegacyHex);
  EXPECT_EQ(to_hex(encode_registration(decode_registration(bytes))), kMoriioLegacyHex);
  EXPECT_EQ(moriio_legacy().bytes(), bytes);
}

TEST(DiscoveryVectors, P2pNcclDecodes) {
  const Registration reg = decode_registration(from_hex(kP2pNcclHex));
  EXPECT_EQ(reg.format, RegistrationFormat::kP2pNccl);
  EXPECT_EQ(reg.connector, Connector::kP2pNccl);
  EXPECT_EQ(reg.role, Role::kDecode);
  EXPECT_EQ(reg.http_address, (HostPort{"127.0.10.6", 8100}));
  EXPECT_EQ(reg.zmq_address, "127.0.10.6:21001");
  ASSERT_TRUE(reg.kv_address.has_value());
  EXPECT_EQ(*reg.kv_address, (HostPort{"127.0.10.6", 21001}));
  EXPECT_FALSE(reg.moriio_zmq.has_value());
  EXPECT_EQ(reg.dp_size, 1u);
  EXPECT_EQ(reg.tp_size, 1u);
  EXPECT_EQ(reg.transfer_mode, TransferMode::kNone);
}

TEST(DiscoveryVectors, P2pNcclEncodesByteExact) {
  const std::string bytes = from_hex(kP2pNcclHex);
  EXPECT_EQ(to_hex(encode_registration(decode_registration(bytes))), kP2pNcclHex);
  EXPECT_EQ(p2p_nccl().bytes(), bytes);
}

TEST(DiscoveryVectors, MoriioIpv6AndLowerCaseModeDecode) {
  const Registration reg = decode_registration(from_hex(kMoriioIpv6Hex));
  EXPECT_EQ(reg.http_address, (HostPort{"fd00::6", 8200}));
  EXPECT_EQ(reg.http_address.to_string(), "[fd00::6]:8200");
  EXPECT_EQ(reg.moriio_zmq->host, "fd00::6");
  EXPECT_EQ(reg.transfer_mode, TransferMode::kWrite);
  EXPECT_EQ(reg.role, Role::kDecode);
}

TEST(DiscoveryVectors, PlainHelloIsIgnored) {
  DiscoveryMessage message;
  message.kind = DiscoveryMessage::Kind::kGoodbye;
  ASSERT_TRUE(decode(from_hex(kHelloHex), &message).is_ok());
  EXPECT_EQ(message.kind, DiscoveryMessage::Kind::kHello);
}

TEST(DiscoveryVectors, HelloWithPdrVIsARegistration) {
  const Registration reg = decode_registration(from_hex(kPdrouterHelloHex));
  EXPECT_EQ(reg.format, RegistrationFormat::kPdrouter);
  EXPECT_EQ(reg.role, Role::kDecode);
  EXPECT_EQ(reg.connector, Connector::kNixl);
  EXPECT_EQ(reg.schema_version, 1u);
  EXPECT_EQ(reg.http_address, (HostPort{"127.0.10.8", 8000}));
  EXPECT_TRUE(reg.zmq_address.empty());
  EXPECT_EQ(decode_registration(encode_registration(reg)), reg);
}

TEST(DiscoveryVectors, PdrouterFullDecodesEveryField) {
  const Registration reg = decode_registration(from_hex(kPdrouterFullHex));
  EXPECT_EQ(reg.format, RegistrationFormat::kPdrouter);
  EXPECT_EQ(reg.role, Role::kPrefill);
  EXPECT_EQ(reg.http_address, (HostPort{"node-3.example", 8000}));
  EXPECT_EQ(*reg.moriio_zmq, (MoriioZmqAddress{"127.0.10.7", 6301, 61005}));
  EXPECT_EQ(reg.dp_size, 4u);
  EXPECT_EQ(reg.tp_size, 2u);
  EXPECT_EQ(reg.transfer_mode, TransferMode::kRead);
  EXPECT_EQ(reg.connector, Connector::kMoriio);
  EXPECT_EQ(reg.schema_version, 1u);
  EXPECT_EQ(reg.instance_id, "node-3-a1b2");
  EXPECT_EQ(reg.epoch, 1700000000123u);
  EXPECT_EQ(reg.model, "meta-llama/Llama-3.1-8B-Instruct");
  EXPECT_EQ(reg.bootstrap_port, std::optional<uint16_t>(8998));
  EXPECT_EQ(reg.labels, (Labels{{"gpu", "mi300x"}, {"rack", "r1"}})) << "sorted by key";
  EXPECT_EQ(reg.load, (NodeLoad{true, 3, 1, 4096}));
  EXPECT_TRUE(reg.draining);
  EXPECT_EQ(reg.ttl_ms, std::optional<uint32_t>(9000));
  EXPECT_EQ(reg.auth_token, "s3cret");
}

TEST(DiscoveryVectors, GoodbyeDecodesAndRoundTrips) {
  DiscoveryMessage message;
  ASSERT_TRUE(decode(from_hex(kGoodbyeHex), &message).is_ok());
  ASSERT_EQ(message.kind, DiscoveryMessage::Kind::kGoodbye);
  const Goodbye& bye = message.goodbye;
  EXPECT_EQ(bye.http_address, (HostPort{"127.0.10.5", 8000}));
  EXPECT_EQ(bye.schema_version, 1u);
  EXPECT_EQ(bye.instance_id, "node-3-a1b2");
  EXPECT_EQ(bye.epoch, 42u);
  EXPECT_EQ(bye.auth_token, "s3cret");
  EXPECT_EQ(to_hex(encode_goodbye(bye)), kGoodbyeHex);

  Goodbye minimal;
  minimal.http_address = {"fd00::1", 9};
  DiscoveryMessage again;
  ASSERT_TRUE(decode(encode_goodbye(minimal), &again).is_ok());
  EXPECT_EQ(again.goodbye, minimal);
}

TEST(DiscoveryVectors, AckRoundTripsByteExact) {
  Ack ack;
  ASSERT_TRUE(decode_ack(as_bytes(from_hex(kAckHex)), &ack).is_ok());
  EXPECT_TRUE(ack.ok);
  EXPECT_EQ(ack.reason, "");
  EXPECT_EQ(ack.ttl_ms, 9000u);
  EXPECT_EQ(ack.registry_version, 17u);
  EXPECT_EQ(to_hex(encode_ack(ack)), kAckHex);

  const Ack refused{false, "unauthenticated: bad token", 0, 1ull << 40};
  Ack decoded;
  ASSERT_TRUE(decode_ack(as_bytes(encode_ack(refused)), &decoded).is_ok());
  EXPECT_EQ(decoded, refused);
}

TEST(DiscoveryVectors, AckRejectsOtherMessages) {
  Ack ack;
  Status s = decode_ack(as_bytes(from_hex(kMoriioCurrentHex)), &ack);
  EXPECT_EQ(s.code(), StatusCode::kUnknownType);
  EXPECT_NE(s.message().find("expected type 'ack', got 'P'"), std::string::npos);
  s = decode_ack(
      as_bytes(MessageBuilder().set("type", str_value("ack")).set("pdr_v", uint_value(1)).bytes()),
      &ack);
  EXPECT_EQ(s.code(), StatusCode::kMissingKey);
  EXPECT_EQ(s.message(), "ok is required for an ack");
  s = decode_ack(as_bytes(MessageBuilder()
                              .set("type", str_value("ack"))
                              .set("pdr_v", uint_value(1))
                              .set("ok", uint_value(1))
                              .bytes()),
                 &ack);
  EXPECT_EQ(s.code(), StatusCode::kWrongType);
  EXPECT_EQ(s.message(), "ok must be a bool, got int");
  s = decode_ack(as_bytes(std::string("\x91\x01", 2)), &ack);
  EXPECT_EQ(s.code(), StatusCode::kWrongType);
}

// ---- pdrouter extension ----

Registration full_pdrouter_registration() {
  Registration reg;
  reg.format = RegistrationFormat::kPdrouter;
  reg.role = Role::kDecode;
  reg.http_address = {"fd00::9", 8000};
  reg.zmq_address = "host:fd00::9,handshake:7000,notify:7001";
  reg.moriio_zmq = MoriioZmqAddress{"fd00::9", 7000, 7001};
  reg.dp_size = 8;
  reg.tp_size = 1024;
  reg.transfer_mode = TransferMode::kWrite;
  reg.connector = Connector::kMoriio;
  reg.schema_version = 3;
  reg.instance_id = std::string(128, 'i');
  reg.epoch = ~0ull;
  reg.model = std::string(256, 'm');
  reg.bootstrap_port = 65535;
  reg.kv_events_endpoint = HostPort{"fd00::9", 5557};
  // The longest host: 253 chars, labels of 63.
  reg.kv_events_replay_endpoint = HostPort{
      std::string(63, 'r') + "." + std::string(63, 'r') + "." + std::string(63, 'r') + "." +
          std::string(61, 'r'),
      65535};
  reg.kv_events_ports = {5557, 1, 65535, 40001, 40002, 33000, 2, 5558};  // dp_size 8
  reg.kv_events_replay_ports = {65535, 65534, 65533, 65532, 65531, 65530, 65529, 1};
  for (int i = 0; i < 32; ++i)
    reg.labels.emplace_back("k" + std::to_string(100 + i), std::string(256, 'v'));
  reg.load = {true, 0xffffffffu, 0, ~0ull};
  reg.draining = true;
  reg.ttl_ms = 1;
  reg.auth_token = std::string(256, 'a');
  return reg;
}

TEST(PdrouterExtension, RoundTripsEveryFieldAtItsLimits) {
  const Registration reg = full_pdrouter_registration();
  const std::string bytes = encode_registration(reg);
  EXPECT_EQ(decode_registration(bytes), reg);
  EXPECT_EQ(encode_registration(decode_registration(bytes)), bytes) << "encoding is stable";
}

TEST(PdrouterExtension, RoundTripsP2pAndConnectorlessShapes) {
  Registration p2p;
  p2p.format = RegistrationFormat::kPdrouter;
  p2p.http_address = {"127.0.10.1", 80};
  p2p.zmq_address = "127.0.10.1:21001";
  p2p.kv_address = HostPort{"127.0.10.1", 21001};
  p2p.connector = Connector::kP2pNccl;
  p2p.schema_version = 1;
  EXPECT_EQ(decode_registration(encode_registration(p2p)), p2p);

  Registration bare;
  bare.format = RegistrationFormat::kPdrouter;
  bare.http_address = {"node", 1};
  bare.schema_version = 1;
  bare.connector = Connector::kMooncake;
  bare.bootstrap_port = 8998;
  bare.zmq_address = "anything goes for mooncake";
  EXPECT_EQ(decode_registration(encode_registration(bare)), bare);
}

TEST(PdrouterExtension, ConnectorNoneIsSaidAndNeverInferred) {
  // A node with no KV connector (a render node): "none" goes on the wire, and a zmq_address it
  // happens to carry is kept verbatim instead of turning it into a P2P-NCCL or MoRIIO node.
  Registration none;
  none.format = RegistrationFormat::kPdrouter;
  none.http_address = {"127.0.10.9", 8000};
  none.zmq_address = "127.0.10.9:21001";
  none.schema_version = 1;
  none.no_connector = true;
  const std::string bytes = encode_registration(none);
  EXPECT_NE(bytes.find("none"), std::string::npos);
  const Registration decoded = decode_registration(bytes);
  EXPECT_EQ(decoded.connector, Connector::kUnknown);
  EXPECT_TRUE(decoded.no_connector);
  EXPECT_FALSE(decoded.kv_address);
  EXPECT_EQ(decoded, none);
  EXPECT_EQ(encode_registration(decoded), bytes) << "encoding is stable";

  // What an older replica wrote for the same node (no connector key) still decodes, inferred.
  none.no_connector = false;
  const Registration old = decode_registration(encode_registration(none));
  EXPECT_EQ(old.connector, Connector::kP2pNccl);
  EXPECT_FALSE(old.no_connector);
  // Without a zmq_address the old form was already connectorless.
  EXPECT_EQ(decode_registration(pdrouter_minimal().bytes()).no_connector, false);

  // Exactly "none": another spelling is refused like any unknown name.
  DiscoveryMessage message;
  const Status st = decode(pdrouter_minimal().set("connector", str_value("None")).bytes(), &message);
  EXPECT_EQ(st.code(), StatusCode::kInvalidValue);
  EXPECT_NE(st.message().find("none"), std::string::npos) << st.message();
  Registration stated = decode_registration(pdrouter_minimal().set("connector", str_value("none")).bytes());
  EXPECT_EQ(stated.connector, Connector::kUnknown);
  EXPECT_TRUE(stated.no_connector);
}

TEST(PdrouterExtension, InfersConnectorFromZmqAddressShape) {
  Registration reg =
      decode_registration(pdrouter_minimal()
                              .set("zmq_address", str_value("host:h,handshake:1,notify:2"))
                              .set("transfer_mode", str_value("Write"))
                              .bytes());
  EXPECT_EQ(reg.connector, Connector::kMoriio);
  EXPECT_EQ(*reg.moriio_zmq, (MoriioZmqAddress{"h", 1, 2}));

  reg = decode_registration(pdrouter_minimal().set("zmq_address", str_value("h:5")).bytes());
  EXPECT_EQ(reg.connector, Connector::kP2pNccl);
  EXPECT_EQ(*reg.kv_address, (HostPort{"h", 5}));

  reg = decode_registration(pdrouter_minimal().bytes());
  EXPECT_EQ(reg.connector, Connector::kUnknown);
  EXPECT_EQ(reg.format, RegistrationFormat::kPdrouter);
  EXPECT_EQ(reg.schema_version, 1u);
  EXPECT_EQ(reg.dp_size, 1u);
}

TEST(PdrouterExtension, UnknownConnectorMeansInfer) {
  const Registration reg = decode_registration(pdrouter_minimal()
                                                   .set("connector", str_value("unknown"))
                                                   .set("zmq_address", str_value("h:5"))
                                                   .bytes());
  EXPECT_EQ(reg.connector, Connector::kP2pNccl);

  // What a node-side client builds without naming a connector: the router infers it.
  Registration client;
  client.format = RegistrationFormat::kPdrouter;
  client.http_address = {"127.0.10.9", 8000};
  client.zmq_address = "host:127.0.10.9,handshake:6301,notify:61005";
  client.transfer_mode = TransferMode::kRead;
  client.schema_version = 1;
  const Registration decoded = decode_registration(encode_registration(client));
  EXPECT_EQ(decoded.connector, Connector::kMoriio);
  EXPECT_EQ(decoded.moriio_zmq, (MoriioZmqAddress{"127.0.10.9", 6301, 61005}));
}

TEST(PdrouterExtension, StartsWithTheMoriioCurrentKeys) {
  Registration reg = decode_registration(from_hex(kMoriioCurrentHex));
  const std::string moriio = encode_registration(reg);
  reg.format = RegistrationFormat::kPdrouter;
  reg.schema_version = 1;
  const std::string pdrouter = encode_registration(reg);
  ASSERT_EQ(static_cast<unsigned char>(pdrouter[0]), 0x88u) << "6 base keys + pdr_v + connector";
  EXPECT_TRUE(pdrouter.substr(1).starts_with(moriio.substr(1)))
      << "a vLLM-style parser reads the same base keys";
}

TEST(PdrouterExtension, AcceptsNewerVersionsUnknownKeysAndNil) {
  const Registration reg = decode_registration(pdrouter_minimal()
                                                   .set("pdr_v", uint_value(7))
                                                   .set("future_key", array_value(3))
                                                   .set("model", nil_value())
                                                   .set("ttl_ms", nil_value())
                                                   .bytes());
  EXPECT_EQ(reg.schema_version, 7u);
  EXPECT_EQ(reg.model, "");
  EXPECT_FALSE(reg.ttl_ms.has_value());
}

TEST(PdrouterExtension, RoleKeyMustAgreeWithType) {
  EXPECT_EQ(decode_registration(pdrouter_minimal().set("role", str_value("prefill")).bytes()).role,
            Role::kPrefill);
  EXPECT_TRUE(FailsWith(pdrouter_minimal().set("role", str_value("decode")).bytes(),
                        StatusCode::kInvalidValue, "role 'decode' contradicts type 'prefill'"));
}

TEST(PdrouterExtension, RejectsEachBadExtensionValue) {
  struct Case {
    const char* key;
    std::string value;
    StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"pdr_v", uint_value(0), StatusCode::kOutOfRange, "pdr_v 0 is out of range 1..4294967295"},
      {"pdr_v", str_value("1"), StatusCode::kWrongType, "pdr_v must be an integer, got str"},
      {"pdr_v", uint_value(1ull << 32), StatusCode::kOutOfRange,
       "pdr_v 4294967296 is out of range"},
      {"instance_id", uint_value(1), StatusCode::kWrongType,
       "instance_id must be a string, got int"},
      {"instance_id", str_value(std::string(129, 'i')), StatusCode::kTooLarge,
       "instance_id is 129 bytes, limit 128"},
      {"epoch", int_value(-1), StatusCode::kOutOfRange, "epoch -1 is out of range"},
      {"epoch", str_value("1"), StatusCode::kWrongType, "epoch must be an integer, got str"},
      {"model", bool_value(true), StatusCode::kWrongType, "model must be a string, got bool"},
      {"model", str_value(std::string(257, 'm')), StatusCode::kTooLarge,
       "model is 257 bytes, limit 256"},
      {"connector", str_value("rdma"), StatusCode::kInvalidValue, "connector 'rdma' is not one of"},
      {"connector", uint_value(1), StatusCode::kWrongType, "connector must be a string, got int"},
      {"bootstrap_port", uint_value(0), StatusCode::kOutOfRange,
       "bootstrap_port 0 is out of range 1..65535"},
      {"bootstrap_port", uint_value(70000), StatusCode::kOutOfRange, "bootstrap_port 70000"},
      {"bootstrap_port", str_value("8998"), StatusCode::kWrongType,
       "bootstrap_port must be an integer, got str"},
      {"kv_events_endpoint", str_value("127.0.10.5:5557"), StatusCode::kBadAddress,
       "kv_events_endpoint '127.0.10.5:5557': missing the 'tcp://' scheme"},
      {"kv_events_endpoint", str_value("tcp://*:5557"), StatusCode::kBadAddress,
       "kv_events_endpoint 'tcp://*:5557': host '*' is the publisher's bind form"},
      {"kv_events_endpoint", str_value("tcp://0.0.0.0:5557"), StatusCode::kBadAddress,
       "host '0.0.0.0' is a wildcard (bind) address"},
      {"kv_events_endpoint", str_value("ipc:///tmp/kv"), StatusCode::kBadAddress,
       "scheme 'ipc' names a socket on the router's own host"},
      {"kv_events_endpoint", str_value("udp://h:1"), StatusCode::kBadAddress,
       "scheme 'udp' is not supported; expected tcp://host:port"},
      {"kv_events_endpoint", str_value("tcp://h:0"), StatusCode::kBadAddress,
       "port '0' is out of range 1..65535"},
      {"kv_events_endpoint", str_value("tcp://h:5557/x"), StatusCode::kBadAddress, "has a path"},
      {"kv_events_endpoint", uint_value(5557), StatusCode::kWrongType,
       "kv_events_endpoint must be a string, got int"},
      {"kv_events_endpoint", str_value("tcp://" + std::string(300, 'h') + ":1"),
       StatusCode::kTooLarge, "kv_events_endpoint is 308 bytes, limit 300"},
      {"kv_events_replay_endpoint", str_value("tcp://h"), StatusCode::kBadAddress,
       "kv_events_replay_endpoint 'tcp://h': missing ':port'"},
      {"labels", array_value(1), StatusCode::kWrongType, "labels must be a map, got array"},
      {"labels", MessageBuilder().set("k", uint_value(1)).value(), StatusCode::kWrongType,
       "labels['k'] must be a string, got int"},
      {"labels", MessageBuilder().set("", str_value("v")).value(), StatusCode::kInvalidValue,
       "labels has an empty key"},
      {"labels", MessageBuilder().set(std::string(65, 'k'), str_value("v")).value(),
       StatusCode::kTooLarge, "is 65 bytes, limit 64"},
      {"labels", MessageBuilder().set("k", str_value(std::string(257, 'v'))).value(),
       StatusCode::kTooLarge, "labels['k'] is 257 bytes, limit 256"},
      {"labels", MessageBuilder().append("k", str_value("a")).append("k", str_value("b")).value(),
       StatusCode::kMalformed, "key 'k' appears twice in labels"},
      {"labels", packed([](auto& p) { p.pack_map(1).pack_uint8(1).pack_uint8(1); }),
       StatusCode::kWrongType, "labels keys must be strings, got int"},
      {"load", str_value("busy"), StatusCode::kWrongType, "load must be a map, got str"},
      {"load", MessageBuilder().set("running", str_value("3")).value(), StatusCode::kWrongType,
       "running must be an integer, got str"},
      {"load", MessageBuilder().set("waiting", uint_value(1ull << 32)).value(),
       StatusCode::kOutOfRange, "waiting 4294967296 is out of range 0..4294967295"},
      {"load", MessageBuilder().set("free_kv_blocks", int_value(-5)).value(),
       StatusCode::kOutOfRange, "free_kv_blocks -5 is out of range"},
      {"draining", uint_value(1), StatusCode::kWrongType, "draining must be a bool, got int"},
      {"ttl_ms", uint_value(0), StatusCode::kOutOfRange, "ttl_ms 0 is out of range 1..4294967295"},
      {"ttl_ms", double_value(1.5), StatusCode::kWrongType, "ttl_ms must be an integer, got float"},
      {"auth", uint_value(1), StatusCode::kWrongType, "auth must be a string, got int"},
      {"auth", str_value(std::string(257, 'a')), StatusCode::kTooLarge,
       "auth is 257 bytes, limit 256"},
      {"role", str_value("X"), StatusCode::kInvalidValue,
       "role 'X' is not P, D, prefill or decode"},
      {"dp_size", uint_value(0), StatusCode::kOutOfRange, "dp_size 0 is out of range 1..1024"},
      {"transfer_mode", str_value("none"), StatusCode::kInvalidValue,
       "transfer_mode 'none' is not READ or WRITE"},
      {"http_address", str_value("http://127.0.10.7:8000"), StatusCode::kBadAddress,
       "http_address 'http://127.0.10.7:8000': has a URL scheme"},
      {"zmq_address", str_value("host:h,handshake:1"), StatusCode::kBadAddress,
       "zmq_address 'host:h,handshake:1': missing the 'notify' key"},
      {"zmq_address", str_value("h"), StatusCode::kBadAddress, "zmq_address 'h': missing ':port'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.key);
    MessageBuilder message = pdrouter_minimal().set(c.key, c.value);
    if (std::string_view(c.key) == "zmq_address" && c.value.find("host:") != std::string::npos) {
      message.set("transfer_mode", str_value("READ"));
    }
    EXPECT_TRUE(FailsWith(message.bytes(), c.code, c.message));
  }
}

TEST(PdrouterExtension, KvEventsEndpointsDecodeAndFormatPerDpRank) {
  const Registration reg =
      decode_registration(pdrouter_minimal()
                              .set("kv_events_endpoint", str_value("TCP://node-3:5557"))
                              .set("kv_events_replay_endpoint", str_value("tcp://[fd00::1]:5600"))
                              .bytes());
  ASSERT_TRUE(reg.kv_events_endpoint.has_value());
  EXPECT_EQ(*reg.kv_events_endpoint, (HostPort{"node-3", 5557}));
  EXPECT_EQ(*reg.kv_events_replay_endpoint, (HostPort{"fd00::1", 5600}));
  EXPECT_EQ(zmq_tcp_endpoint(*reg.kv_events_endpoint), "tcp://node-3:5557");
  EXPECT_EQ(zmq_tcp_endpoint(*reg.kv_events_endpoint, 3), "tcp://node-3:5560") << "DP rank 3";
  EXPECT_EQ(zmq_tcp_endpoint(*reg.kv_events_replay_endpoint, 1), "tcp://[fd00::1]:5601");
  EXPECT_EQ(zmq_tcp_endpoint(HostPort{"h", 65535}, 1), "") << "past the last port";
}

// pdnode sim with port 0 binds an ephemeral port per DP rank and lists them: a base port plus
// the rank may be any other process's port.
TEST(PdrouterExtension, KvEventsRankPortsNameEachDpRanksPort) {
  auto ports = [](std::initializer_list<uint64_t> list) {
    return packed([&](auto& p) {
      p.pack_array(static_cast<uint32_t>(list.size()));
      for (uint64_t v : list) p.pack_uint64(v);
    });
  };
  MessageBuilder message = pdrouter_minimal()
                               .set("dp_size", uint_value(3))
                               .set("kv_events_endpoint", str_value("tcp://127.0.10.5:41000"))
                               .set("kv_events_ports", ports({41000, 35011, 52222}))
                               .set("kv_events_replay_endpoint", str_value("tcp://127.0.10.5:41007"))
                               .set("kv_events_replay_ports", ports({41007, 41003, 40999}));
  const Registration reg = decode_registration(message.bytes());
  EXPECT_EQ(reg.kv_events_ports, (std::vector<uint16_t>{41000, 35011, 52222}));
  EXPECT_EQ(reg.kv_events_replay_ports, (std::vector<uint16_t>{41007, 41003, 40999}));
  const HostPort base = *reg.kv_events_endpoint;
  EXPECT_EQ(zmq_tcp_rank_endpoint(base, reg.kv_events_ports, 0), "tcp://127.0.10.5:41000");
  EXPECT_EQ(zmq_tcp_rank_endpoint(base, reg.kv_events_ports, 1), "tcp://127.0.10.5:35011");
  EXPECT_EQ(zmq_tcp_rank_endpoint(base, reg.kv_events_ports, 2), "tcp://127.0.10.5:52222");
  EXPECT_EQ(zmq_tcp_rank_endpoint(base, reg.kv_events_ports, 3), "") << "no such rank";
  EXPECT_EQ(zmq_tcp_rank_endpoint(base, {}, 2), "tcp://127.0.10.5:41002") << "vLLM: port + rank";
  EXPECT_EQ(zmq_tcp_rank_endpoint(HostPort{"h", 65535}, {}, 1), "");
  EXPECT_EQ(encode_registration(reg), encode_registration(decode_registration(encode_registration(reg))));
  EXPECT_EQ(decode_registration(encode_registration(reg)), reg);

  struct Case {
    MessageBuilder message;
    StatusCode code;
    const char* text;
  };
  const std::vector<Case> cases = {
      {MessageBuilder(message).set("kv_events_ports", ports({41000, 35011})),
       StatusCode::kInvalidValue, "kv_events_ports has 2 ports for dp_size 3"},
      {MessageBuilder(message).set("kv_events_ports", ports({41001, 35011, 52222})),
       StatusCode::kInvalidValue, "kv_events_ports[0] 41001 is not kv_events_endpoint's port 41000"},
      {MessageBuilder(message).set("kv_events_ports", ports({41000, 0, 52222})),
       StatusCode::kOutOfRange, "kv_events_ports[1] 0 is out of range 1..65535"},
      {MessageBuilder(message).set("kv_events_replay_ports", ports({41007, 41003, 65536})),
       StatusCode::kOutOfRange, "kv_events_replay_ports[2] 65536 is out of range 1..65535"},
      {MessageBuilder(message).set("kv_events_ports", str_value("41000,35011,52222")),
       StatusCode::kWrongType, "kv_events_ports must be an array of ports, got str"},
      {MessageBuilder(message).set("kv_events_ports",
                                   packed([](auto& p) { p.pack_array(3).pack_uint16(41000).pack_nil().pack_uint16(1); })),
       StatusCode::kWrongType, "kv_events_ports[1] must be an integer, got nil"},
      {pdrouter_minimal().set("dp_size", uint_value(2)).set("kv_events_ports", ports({41000, 41001})),
       StatusCode::kMissingKey, "kv_events_ports needs kv_events_endpoint"},
      {pdrouter_minimal().set("kv_events_endpoint", str_value("tcp://127.0.10.5:41000"))
           .set("kv_events_replay_ports", ports({41000})),
       StatusCode::kMissingKey, "kv_events_replay_ports needs kv_events_replay_endpoint"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    EXPECT_TRUE(FailsWith(c.message.bytes(), c.code, c.text));
  }
}

TEST(PdrouterExtension, LabelsLimitIs32Entries) {
  MessageBuilder labels;
  for (int i = 0; i < 32; ++i) labels.set("k" + std::to_string(i), str_value("v"));
  EXPECT_EQ(
      decode_registration(pdrouter_minimal().set("labels", labels.value()).bytes()).labels.size(),
      32u);
  labels.set("k32", str_value("v"));
  EXPECT_TRUE(FailsWith(pdrouter_minimal().set("labels", labels.value()).bytes(),
                        StatusCode::kTooLarge, "labels has 33 entries, limit 32"));
}

TEST(PdrouterExtension, ConnectorRequirements) {
  EXPECT_TRUE(FailsWith(
      pdrouter_minimal().set("connector", str_value("moriio")).bytes(), StatusCode::kMissingKey,
      "zmq_address is required for a pdrouter registration with connector moriio"));
  EXPECT_TRUE(FailsWith(
      pdrouter_minimal().set("connector", str_value("p2p_nccl")).bytes(), StatusCode::kMissingKey,
      "zmq_address is required for a pdrouter registration with connector p2p-nccl"));
  EXPECT_TRUE(FailsWith(
      pdrouter_minimal().set("zmq_address", str_value("host:h,handshake:1,notify:2")).bytes(),
      StatusCode::kMissingKey,
      "transfer_mode is required for a pdrouter registration with connector moriio"));
  EXPECT_TRUE(FailsWith(pdrouter_minimal()
                            .set("connector", str_value("moriio"))
                            .set("zmq_address", str_value("127.0.10.1:5"))
                            .set("transfer_mode", str_value("READ"))
                            .bytes(),
                        StatusCode::kBadAddress,
                        "zmq_address '127.0.10.1:5': unknown key '127.0.10.1'"));
  EXPECT_TRUE(FailsWith(pdrouter_minimal()
                            .set("connector", str_value("nixl"))
                            .set("zmq_address", str_value(std::string("a\0b", 3)))
                            .bytes(),
                        StatusCode::kBadAddress, "contains a NUL byte"));
  EXPECT_TRUE(FailsWith(MessageBuilder()
                            .set("type", str_value("HELLO"))
                            .set("pdr_v", uint_value(1))
                            .set("http_address", str_value("h:1"))
                            .bytes(),
                        StatusCode::kMissingKey, "role is required for a pdrouter registration"));
  EXPECT_TRUE(FailsWith(
      MessageBuilder().set("type", str_value("HELLO")).set("pdr_v", str_value("1")).bytes(),
      StatusCode::kWrongType, "pdr_v must be an integer, got str"));
}

// A NIXL push prefill says who it is (engine id, side channel); its decodes are sent both.
TEST(PdrouterExtension, NixlPushPrefillNeedsEngineIdAndSideChannel) {
  EXPECT_TRUE(FailsWith(pdrouter_minimal().set("connector", str_value("nixl-push")).set("engine_id", str_value("e")).bytes(),
                        StatusCode::kMissingKey, "zmq_address (the KV side channel, host:port) is required"));
  EXPECT_TRUE(FailsWith(
      pdrouter_minimal().set("connector", str_value("nixl-push")).set("zmq_address", str_value("127.0.10.7:5600")).bytes(),
      StatusCode::kMissingKey, "engine_id is required for a nixl-push prefill"));
  EXPECT_TRUE(FailsWith(pdrouter_minimal()
                            .set("connector", str_value("nixl-push"))
                            .set("zmq_address", str_value("not a host port"))
                            .set("engine_id", str_value("e"))
                            .bytes(),
                        StatusCode::kBadAddress, "zmq_address"));
  EXPECT_TRUE(FailsWith(pdrouter_minimal().set("engine_id", str_value(std::string(257, 'e'))).bytes(),
                        StatusCode::kTooLarge, "engine_id"));
  EXPECT_TRUE(FailsWith(pdrouter_minimal().set("pp_size", uint_value(0)).bytes(), StatusCode::kOutOfRange, "pp_size"));

  Registration reg;
  reg.format = RegistrationFormat::kPdrouter;
  reg.schema_version = 1;
  reg.role = Role::kPrefill;
  reg.connector = Connector::kNixlPush;
  reg.http_address = {"127.0.10.7", 8000};
  reg.zmq_address = "127.0.10.7:5600";
  reg.kv_address = HostPort{"127.0.10.7", 5600};
  reg.engine_id = "prefill-engine-001";
  reg.pp_size = 2;
  DiscoveryMessage decoded;
  const std::string wire = encode_registration(reg);
  ASSERT_TRUE(decode_discovery_message(as_bytes(wire), DecodeLimits{}, &decoded).is_ok());
  ASSERT_EQ(decoded.kind, DiscoveryMessage::Kind::kRegistration);
  EXPECT_EQ(decoded.registration, reg);
  // A push decode needs neither.
  EXPECT_TRUE(decode_discovery_message(
                  as_bytes(pdrouter_minimal().set("type", str_value("D")).set("connector", str_value("nixl_push")).bytes()),
                  DecodeLimits{}, &decoded)
                  .is_ok());
}

// ---- Integer widths ----

TEST(IntegerWidths, EveryEncodingOfTwoIsAccepted) {
  const std::vector<std::string> encodings = {
      "02",   "cc02",   "cd0002",     "ce00000002",        "cf0000000000000002",
      "d002", "d10002", "d200000002", "d30000000000000002"};
  for (const std::string& hex : encodings) {
    SCOPED_TRACE(hex);
    const Registration reg =
        decode_registration(moriio_current().set("dp_size", from_hex(hex)).bytes());
    EXPECT_EQ(reg.dp_size, 2u);
  }
}

TEST(IntegerWidths, OutOfRangeAndWrongTypesAreReportedPrecisely) {
  struct Case {
    std::string value;
    StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {from_hex("ff"), StatusCode::kOutOfRange, "dp_size -1 is out of range 1..1024"},
      {from_hex("d080"), StatusCode::kOutOfRange, "dp_size -128 is out of range 1..1024"},
      {int_value(-40000), StatusCode::kOutOfRange, "dp_size -40000 is out of range 1..1024"},
      {uint_value(0), StatusCode::kOutOfRange, "dp_size 0 is out of range 1..1024"},
      {uint_value(1025), StatusCode::kOutOfRange, "dp_size 1025 is out of range 1..1024"},
      {uint_value(~0ull), StatusCode::kOutOfRange, "dp_size 18446744073709551615 is out of range"},
      {double_value(2.0), StatusCode::kWrongType, "dp_size must be an integer, got float"},
      {from_hex("ca40000000"), StatusCode::kWrongType, "dp_size must be an integer, got float"},
      {str_value("2"), StatusCode::kWrongType, "dp_size must be an integer, got str"},
      {bool_value(true), StatusCode::kWrongType, "dp_size must be an integer, got bool"},
      {nil_value(), StatusCode::kWrongType, "dp_size must be an integer, got nil"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_TRUE(FailsWith(moriio_current().set("dp_size", c.value).bytes(), c.code, c.message));
  }
  EXPECT_EQ(decode_registration(moriio_current().set("tp_size", uint_value(1024)).bytes()).tp_size,
            1024u);
}

// ---- Required keys, per dialect ----

TEST(RequiredKeys, EachDialectNamesTheMissingKey) {
  struct Case {
    MessageBuilder base;
    std::vector<std::string> keys;
    const char* context;
  };
  const std::vector<Case> cases = {
      {moriio_current(),
       {"http_address", "dp_size", "tp_size", "transfer_mode"},
       "a MoRIIO registration"},
      {moriio_legacy(),
       {"role", "request_address", "handshake_port", "notify_port", "dp_size", "tp_size",
        "transfer_mode"},
       "a MoRIIO legacy registration"},
      {p2p_nccl(), {"http_address"}, "a P2P-NCCL registration"},
      {p2p_nccl(), {"zmq_address"}, "a P/D registration"},
      {moriio_current(), {"zmq_address"}, "a P/D registration"},
      {goodbye(), {"http_address", "pdr_v"}, "a goodbye"},
      {pdrouter_minimal(), {"http_address"}, "a pdrouter registration"},
  };
  for (const Case& c : cases) {
    for (const std::string& key : c.keys) {
      SCOPED_TRACE(key + " / " + c.context);
      MessageBuilder message = c.base;
      EXPECT_TRUE(FailsWith(message.erase(key).bytes(), StatusCode::kMissingKey,
                            key + " is required for " + c.context));
    }
  }
  EXPECT_TRUE(FailsWith(moriio_current().erase("type").bytes(), StatusCode::kMissingKey,
                        "type is required"));
}

TEST(RequiredKeys, OptionalKeysMayBeAbsent) {
  EXPECT_EQ(decode_registration(moriio_legacy().erase("index").bytes()).legacy_index, "");
  EXPECT_EQ(decode_registration(moriio_legacy().set("index", uint_value(12)).bytes()).legacy_index,
            "12");
  EXPECT_EQ(decode_registration(moriio_legacy().set("index", int_value(-3)).bytes()).legacy_index,
            "-3");
  DiscoveryMessage message;
  ASSERT_TRUE(decode(goodbye().bytes(), &message).is_ok());
  EXPECT_EQ(message.goodbye.instance_id, "");
  EXPECT_EQ(message.goodbye.epoch, 0u);
}

// ---- Wrong types, per key ----

TEST(WrongTypes, EachKeyNamesTheTypeReceived) {
  struct Case {
    MessageBuilder base;
    const char* key;
    std::string value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {moriio_current(), "type", uint_value(1), "type must be a string, got int"},
      {moriio_current(), "http_address", uint_value(1), "http_address must be a string, got int"},
      {moriio_current(), "zmq_address", array_value(2), "zmq_address must be a string, got array"},
      {moriio_current(), "dp_size", str_value("2"), "dp_size must be an integer, got str"},
      {moriio_current(), "tp_size", double_value(8), "tp_size must be an integer, got float"},
      {moriio_current(), "transfer_mode", uint_value(0), "transfer_mode must be a string, got int"},
      {moriio_legacy(), "role", uint_value(0), "role must be a string, got int"},
      {moriio_legacy(), "request_address", nil_value(),
       "request_address must be a string, got nil"},
      {moriio_legacy(), "handshake_port", str_value("6301"),
       "handshake_port must be an integer, got str"},
      {moriio_legacy(), "notify_port", double_value(1),
       "notify_port must be an integer, got float"},
      {moriio_legacy(), "index", double_value(1),
       "index must be a string or an integer, got float"},
      {p2p_nccl(), "http_address", bool_value(false), "http_address must be a string, got bool"},
      {p2p_nccl(), "zmq_address", uint_value(1), "zmq_address must be a string, got int"},
      {goodbye(), "pdr_v", str_value("1"), "pdr_v must be an integer, got str"},
      {goodbye(), "epoch", double_value(1), "epoch must be an integer, got float"},
      {goodbye(), "instance_id", uint_value(1), "instance_id must be a string, got int"},
      {goodbye(), "auth", uint_value(1), "auth must be a string, got int"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    MessageBuilder message = c.base;
    EXPECT_TRUE(FailsWith(message.set(c.key, c.value).bytes(), StatusCode::kWrongType, c.message));
  }
}

TEST(WrongTypes, InvalidValuesAndRanges) {
  EXPECT_TRUE(FailsWith(moriio_current().set("transfer_mode", str_value("SIDEWAYS")).bytes(),
                        StatusCode::kInvalidValue,
                        "transfer_mode 'SIDEWAYS' is not READ or WRITE"));
  EXPECT_TRUE(FailsWith(moriio_legacy().set("role", str_value("X")).bytes(),
                        StatusCode::kInvalidValue, "role 'X' is not P, D, prefill or decode"));
  EXPECT_TRUE(FailsWith(moriio_legacy().set("handshake_port", uint_value(70000)).bytes(),
                        StatusCode::kOutOfRange, "handshake_port 70000 is out of range 1..65535"));
  EXPECT_TRUE(FailsWith(moriio_legacy().set("notify_port", uint_value(0)).bytes(),
                        StatusCode::kOutOfRange, "notify_port 0 is out of range 1..65535"));
  EXPECT_TRUE(FailsWith(goodbye().set("pdr_v", uint_value(0)).bytes(), StatusCode::kOutOfRange,
                        "pdr_v 0 is out of range"));
  EXPECT_EQ(decode_registration(moriio_legacy().set("role", str_value("D")).bytes()).role,
            Role::kDecode);
  EXPECT_EQ(decode_registration(moriio_current().set("transfer_mode", str_value("rEaD")).bytes())
                .transfer_mode,
            TransferMode::kRead);
}

// ---- Addresses inside messages ----

TEST(MessageAddresses, BadAddressesNameKeyValueAndReason) {
  struct Case {
    MessageBuilder base;
    const char* key;
    std::string value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {moriio_current(), "http_address", "127.0.10.5", "http_address '127.0.10.5': missing ':port'"},
      {moriio_current(), "http_address", "127.0.10.5:0",
       "http_address '127.0.10.5:0': port '0' is out of range"},
      {moriio_current(), "http_address", "127.0.10.5:70000", "port '70000' is out of range 1..65535"},
      {moriio_current(), "http_address", "http://127.0.10.5:8000/v1",
       "http_address 'http://127.0.10.5:8000/v1': has a URL scheme; expected host:port"},
      {moriio_current(), "http_address", "fd00::5:8000", "IPv6 host must be in brackets"},
      {moriio_current(), "zmq_address", "host:127.0.10.5,handshake:6301",
       "zmq_address 'host:127.0.10.5,handshake:6301': missing the 'notify' key"},
      {moriio_current(), "zmq_address", "host:127.0.10.5,handshake:6301,notify:1,qp:4",
       "unknown key 'qp'"},
      {moriio_current(), "zmq_address", "host:1.2.3.4,handshake:x,notify:5",
       "zmq_address 'host:1.2.3.4,handshake:x,notify:5': handshake port 'x' is not a number"},
      {moriio_current(), "zmq_address", "host:,handshake:1,notify:5", "host is empty"},
      {moriio_legacy(), "request_address", "https://127.0.10.5:8000/v1/completions",
       "request_address 'https://127.0.10.5:8000/v1/completions': scheme 'https' is not supported"},
      {moriio_legacy(), "request_address", "127.0.10.5:8000", "missing the 'http://' scheme"},
      {p2p_nccl(), "zmq_address", "127.0.10.6", "zmq_address '127.0.10.6': missing ':port'"},
      {p2p_nccl(), "zmq_address", "127.0.10.6:0", "port '0' is out of range"},
      {p2p_nccl(), "http_address", std::string("127.0.10.6\0:8100", 16), "'127.0.10.6\\x00:8100'"},
      {goodbye(), "http_address", "http://127.0.10.5:8000", "has a URL scheme"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    MessageBuilder message = c.base;
    EXPECT_TRUE(FailsWith(message.set(c.key, str_value(c.value)).bytes(), StatusCode::kBadAddress,
                          c.message));
  }
}

TEST(MessageAddresses, LegacyTakesHostPortFromUrl) {
  const Registration reg = decode_registration(
      moriio_legacy().set("request_address", str_value("http://[fd00::2]:9000/v1")).bytes());
  EXPECT_EQ(reg.http_address, (HostPort{"fd00::2", 9000}));
  EXPECT_EQ(reg.zmq_address, "host:fd00::2,handshake:6301,notify:61005");
  EXPECT_EQ(decode_registration(encode_registration(reg)), reg);
}

// ---- Message classification ----

TEST(Classification, TypeDecidesTheDialect) {
  EXPECT_TRUE(FailsWith(moriio_current().set("type", str_value("X")).bytes(),
                        StatusCode::kUnknownType, "unknown message type 'X'"));
  EXPECT_TRUE(FailsWith(moriio_current().set("type", str_value(std::string(100, 'T'))).bytes(),
                        StatusCode::kUnknownType, "'" + std::string(64, 'T') + "...'"));
  EXPECT_TRUE(FailsWith(moriio_current().set("type", str_value("p\x01\x1b[31m")).bytes(),
                        StatusCode::kUnknownType, "'p\\x01\\x1b[31m'"));
  EXPECT_TRUE(FailsWith(moriio_current().set("type", str_value("p")).bytes(),
                        StatusCode::kUnknownType, "'p'"));
  // A `register` message carrying pdr_v is still the legacy shape.
  EXPECT_EQ(decode_registration(moriio_legacy().set("pdr_v", uint_value(1)).bytes()).format,
            RegistrationFormat::kMoriioLegacy);
  // P2P-NCCL ignores the MoRIIO keys, whatever their type.
  const Registration p2p = decode_registration(
      p2p_nccl().set("dp_size", str_value("junk")).set("transfer_mode", uint_value(3)).bytes());
  EXPECT_EQ(p2p.format, RegistrationFormat::kP2pNccl);
  EXPECT_EQ(p2p.dp_size, 1u);
  EXPECT_EQ(p2p.transfer_mode, TransferMode::kNone);
  // Unknown keys are ignored in vLLM dialects.
  EXPECT_EQ(decode_registration(moriio_current().set("extra", array_value(4)).bytes()).format,
            RegistrationFormat::kMoriio);
}

TEST(Classification, EncodeStaticIsEmpty) {
  Registration reg;
  reg.format = RegistrationFormat::kStatic;
  EXPECT_EQ(encode_registration(reg), "");
}

// ---- Malformed bytes and limits ----

TEST(Malformed, TopLevelMustBeAMap) {
  EXPECT_TRUE(FailsWith(from_hex("93010203"), StatusCode::kWrongType,
                        "payload must be a msgpack map, got array"));
  EXPECT_TRUE(
      FailsWith(str_value("P"), StatusCode::kWrongType, "payload must be a msgpack map, got str"));
  EXPECT_TRUE(FailsWith(uint_value(5), StatusCode::kWrongType, "got int"));
  EXPECT_TRUE(FailsWith(nil_value(), StatusCode::kWrongType, "got nil"));
}

TEST(Malformed, TruncatedTrailingEmptyAndInvalidBytes) {
  const std::string good = from_hex(kMoriioCurrentHex);
  for (size_t cut : {size_t{1}, size_t{3}, good.size() / 2, good.size() - 1}) {
    SCOPED_TRACE(cut);
    EXPECT_TRUE(FailsWith(good.substr(0, cut), StatusCode::kMalformed, "truncated"));
  }
  EXPECT_TRUE(FailsWith(good + '\xc0', StatusCode::kMalformed,
                        "1 trailing bytes after the msgpack object"));
  EXPECT_TRUE(FailsWith(good + good, StatusCode::kMalformed, "trailing bytes"));
  EXPECT_TRUE(FailsWith("", StatusCode::kMalformed, "message is empty"));
  EXPECT_TRUE(FailsWith(from_hex("c1"), StatusCode::kMalformed, "invalid msgpack"));
  EXPECT_TRUE(FailsWith(from_hex("81a474797065c1"), StatusCode::kMalformed, "invalid msgpack"));
}

TEST(Malformed, KeysMustBeUniqueStrings) {
  EXPECT_TRUE(FailsWith(moriio_current().append("type", str_value("D")).bytes(),
                        StatusCode::kMalformed, "key 'type' appears twice in payload"));
  EXPECT_TRUE(FailsWith(packed([](auto& p) { p.pack_map(1).pack_uint8(1).pack_uint8(1); }),
                        StatusCode::kWrongType, "payload keys must be strings, got int"));
}

TEST(Limits, MessageSizeIsCheckedFirst) {
  const std::string good = from_hex(kMoriioCurrentHex);
  DecodeLimits small;
  small.max_message_bytes = 16;
  EXPECT_TRUE(FailsWith(good, StatusCode::kTooLarge,
                        "message is " + std::to_string(good.size()) + " bytes, limit 16", small));
  EXPECT_TRUE(FailsWith(std::string(64 * 1024 + 1, '\xc1'), StatusCode::kTooLarge,
                        "message is 65537 bytes, limit 65536"));
}

TEST(Limits, HugeDeclaredContainersFailBeforeAllocating) {
  EXPECT_TRUE(
      FailsWith(from_hex("ddffffffff"), StatusCode::kTooLarge, "an array has more than 64 items"));
  EXPECT_TRUE(
      FailsWith(from_hex("dfffffffff"), StatusCode::kTooLarge, "a map has more than 64 entries"));
  EXPECT_TRUE(FailsWith(moriio_current().set("x", from_hex("ddffffffff")).bytes(),
                        StatusCode::kTooLarge, "array has more than 64"));
  EXPECT_TRUE(FailsWith(moriio_current().set("x", array_value(65)).bytes(), StatusCode::kTooLarge,
                        "array has more than 64"));
  EXPECT_TRUE(FailsWith(moriio_current().set("x", str_value(std::string(4097, 's'))).bytes(),
                        StatusCode::kTooLarge, "a string is longer than 4096 bytes"));
  EXPECT_TRUE(FailsWith(from_hex("dbffffffff41"), StatusCode::kMalformed, "truncated"));
}

TEST(Limits, DeepNestingIsTooDeep) {
  std::string nested = uint_value(1);
  for (int i = 0; i < 4; ++i) nested = from_hex("91") + nested;
  EXPECT_TRUE(FailsWith(moriio_current().set("x", nested).bytes(), StatusCode::kTooDeep,
                        "nesting is deeper than 4 levels"));
  EXPECT_TRUE(
      FailsWith(std::string(10000, '\x91') + '\x01', StatusCode::kTooDeep, "deeper than 4"));
  // Three levels under the top-level map is within the limit.
  std::string ok = uint_value(1);
  for (int i = 0; i < 3; ++i) ok = from_hex("91") + ok;
  EXPECT_EQ(decode_registration(moriio_current().set("x", ok).bytes()).format,
            RegistrationFormat::kMoriio);
}

TEST(Limits, BinAndExtAreRejectedAnywhere) {
  EXPECT_TRUE(FailsWith(moriio_current().set("x", from_hex("c403616263")).bytes(),
                        StatusCode::kWrongType, "bin values are not allowed"));
  EXPECT_TRUE(FailsWith(moriio_current().set("x", from_hex("c400")).bytes(), StatusCode::kWrongType,
                        "key 'x' holds a bin value"));
  EXPECT_TRUE(FailsWith(moriio_current().set("x", from_hex("9290c400")).bytes(),
                        StatusCode::kWrongType, "key 'x' holds a bin value"));
  EXPECT_TRUE(FailsWith(moriio_current().set("http_address", from_hex("c400")).bytes(),
                        StatusCode::kWrongType, "key 'http_address' holds a bin value"));
  EXPECT_TRUE(FailsWith(moriio_current().set("x", from_hex("d40100")).bytes(),
                        StatusCode::kWrongType, "ext values are not allowed"));
  EXPECT_TRUE(
      FailsWith(from_hex("c403616263"), StatusCode::kWrongType, "bin values are not allowed"));
}

TEST(Limits, CustomLimitsApply) {
  DecodeLimits limits;
  limits.max_map_entries = 5;
  EXPECT_TRUE(
      FailsWith(from_hex(kMoriioCurrentHex), StatusCode::kTooLarge, "more than 5 entries", limits));
  limits = DecodeLimits{};
  limits.max_string_bytes = 10;
  EXPECT_TRUE(FailsWith(from_hex(kMoriioCurrentHex), StatusCode::kTooLarge, "longer than 10 bytes",
                        limits));
  limits = DecodeLimits{};
  limits.max_bin_bytes = 8;
  EXPECT_TRUE(FailsWith(moriio_current().set("x", from_hex("c403616263")).bytes(),
                        StatusCode::kWrongType, "key 'x' holds a bin value", limits));
  EXPECT_TRUE(FailsWith(moriio_current().set("x", from_hex("c409") + std::string(9, 'b')).bytes(),
                        StatusCode::kTooLarge, "a bin value is larger than 8 bytes", limits));
}

// ---- Enum names ----

TEST(EnumNames, ToStringAndParseAgree) {
  for (Role r : {Role::kPrefill, Role::kDecode}) {
    Role parsed{};
    ASSERT_TRUE(parse_role(to_string(r), &parsed));
    EXPECT_EQ(parsed, r);
  }
  for (TransferMode m : {TransferMode::kNone, TransferMode::kRead, TransferMode::kWrite}) {
    TransferMode parsed{};
    ASSERT_TRUE(parse_transfer_mode(to_string(m), &parsed));
    EXPECT_EQ(parsed, m);
  }
  for (Connector c : {Connector::kUnknown, Connector::kMoriio, Connector::kP2pNccl,
                      Connector::kNixl, Connector::kMooncake, Connector::kSglang}) {
    Connector parsed{};
    ASSERT_TRUE(parse_connector(to_string(c), &parsed));
    EXPECT_EQ(parsed, c);
  }
  for (RegistrationFormat f :
       {RegistrationFormat::kMoriio, RegistrationFormat::kMoriioLegacy,
        RegistrationFormat::kP2pNccl, RegistrationFormat::kPdrouter, RegistrationFormat::kStatic}) {
    RegistrationFormat parsed{};
    ASSERT_TRUE(parse_registration_format(to_string(f), &parsed));
    EXPECT_EQ(parsed, f);
  }
  Role role{};
  EXPECT_TRUE(parse_role("P", &role));
  EXPECT_EQ(role, Role::kPrefill);
  EXPECT_TRUE(parse_role("D", &role));
  EXPECT_EQ(role, Role::kDecode);
  EXPECT_FALSE(parse_role("X", &role));
  Connector connector{};
  EXPECT_TRUE(parse_connector("p2p_nccl", &connector));
  EXPECT_TRUE(parse_connector("P2PNCCL", &connector));
  EXPECT_EQ(connector, Connector::kP2pNccl);
  EXPECT_FALSE(parse_connector("rdma", &connector));
  TransferMode mode{};
  EXPECT_TRUE(parse_transfer_mode("write", &mode));
  EXPECT_EQ(mode, TransferMode::kWrite);
  EXPECT_EQ(to_string(Connector::kP2pNccl), "p2p-nccl");
  EXPECT_EQ(to_string(RegistrationFormat::kMoriioLegacy), "moriio-legacy");
  EXPECT_EQ(to_string(TransferMode::kRead), "READ");
}

// The fuzzer's seed corpus (tests/fuzz/corpus/discovery_message/, written by make_corpus.py) is
// byte for byte the vectors above, so a change to the script's dicts cannot leave the seeds and
// these tests apart (e.g. the seeds' node addresses, which are in 127.0.0.0/8 like every test's).
TEST(DiscoveryMessage, SeedCorpusIsTheVectors) {
  const std::string dir = pdr::test::source_path("tests/fuzz/corpus/discovery_message/");
  const std::pair<const char*, std::string_view> seeds[] = {
      {"moriio_current", kMoriioCurrentHex}, {"moriio_legacy", kMoriioLegacyHex},
      {"p2p_nccl", kP2pNcclHex},             {"hello", kHelloHex},
      {"moriio_current_ipv6", kMoriioIpv6Hex}, {"pdrouter_full", kPdrouterFullHex},
      {"pdrouter_hello", kPdrouterHelloHex}, {"goodbye", kGoodbyeHex},
      {"ack", kAckHex}};
  for (const auto& [name, hex] : seeds) {
    std::ifstream f(dir + name + ".msgpack", std::ios::binary);
    ASSERT_TRUE(f) << name;
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes, from_hex(hex)) << name << ": rerun /usr/bin/python3 tests/fuzz/make_corpus.py";
  }
}

}  // namespace
}  // namespace pdr::proto
