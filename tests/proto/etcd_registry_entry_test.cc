// The value a replica publishes per registry entry in etcd: a pdrouter registration plus the
// admission class it was admitted with (proto/etcd_registry_entry.h).
#include <gtest/gtest.h>
#include <msgpack.hpp>

#include <fstream>
#include <iterator>
#include <string>

#include "proto/etcd_registry_entry.h"
#include "tests/support/source_path.h"

namespace pdr::proto {
namespace {

Registration sample() {
  Registration reg;
  reg.format = RegistrationFormat::kPdrouter;
  reg.schema_version = 1;
  reg.role = Role::kDecode;
  reg.http_address = {"127.0.40.1", 8000};
  reg.connector = Connector::kNixl;
  reg.epoch = 7;
  reg.model = "m";
  reg.labels = {{"zone", "a"}};
  return reg;
}

TEST(EtcdRegistryEntry, CarriesTheAdmissionClassBesideTheRegistration) {
  const std::string value = encode_etcd_registry_entry(sample(), "curve");
  EtcdRegistryEntry entry;
  ASSERT_TRUE(decode_etcd_registry_entry(as_bytes(value), DecodeLimits{}, &entry).is_ok());
  EXPECT_EQ(entry.admission, "curve");
  EXPECT_EQ(entry.registration.http_address.to_string(), "127.0.40.1:8000");
  EXPECT_EQ(entry.registration.epoch, 7u);
  EXPECT_EQ(entry.registration.model, "m");
  EXPECT_EQ(entry.registration.labels, sample().labels);
  // A replica that predates the key reads the same registration (the key is skipped).
  DiscoveryMessage message;
  ASSERT_TRUE(decode_discovery_message(as_bytes(value), DecodeLimits{}, &message).is_ok());
  EXPECT_EQ(message.registration.http_address, entry.registration.http_address);
}

TEST(EtcdRegistryEntry, AValueWithoutTheKeyHasNoAdmission) {
  // What an older replica writes: the bare registration.
  EtcdRegistryEntry entry;
  ASSERT_TRUE(decode_etcd_registry_entry(as_bytes(encode_registration(sample())), DecodeLimits{}, &entry).is_ok());
  EXPECT_EQ(entry.admission, "");
  ASSERT_TRUE(decode_etcd_registry_entry(as_bytes(encode_etcd_registry_entry(sample(), "")), DecodeLimits{}, &entry)
                  .is_ok());
  EXPECT_EQ(entry.admission, "");
}

std::string with_admission(const msgpack::object& admission) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> packer(buffer);
  packer.pack_map(4);
  packer.pack(std::string("type"));
  packer.pack(std::string("D"));
  packer.pack(std::string("pdr_v"));
  packer.pack(1);
  packer.pack(std::string("http_address"));
  packer.pack(std::string("127.0.40.2:8000"));
  packer.pack(std::string("pdr_admission"));
  packer.pack(admission);
  return std::string(buffer.data(), buffer.size());
}

TEST(EtcdRegistryEntry, RefusesWhatIsNotARegistrationOrABadClassField) {
  EtcdRegistryEntry entry;
  entry.admission = "untouched";
  EXPECT_EQ(decode_etcd_registry_entry(as_bytes(with_admission(msgpack::object(5))), DecodeLimits{}, &entry).code(),
            StatusCode::kWrongType);
  msgpack::zone zone;
  const std::string long_name(33, 'c');
  EXPECT_EQ(decode_etcd_registry_entry(as_bytes(with_admission(msgpack::object(long_name, zone))), DecodeLimits{},
                                       &entry)
                .code(),
            StatusCode::kTooLarge);
  Goodbye bye;
  bye.http_address = {"127.0.40.3", 8000};
  EXPECT_EQ(decode_etcd_registry_entry(as_bytes(encode_goodbye(bye)), DecodeLimits{}, &entry).code(),
            StatusCode::kUnknownType);
  EXPECT_EQ(decode_etcd_registry_entry(as_bytes(std::string("\xc1")), DecodeLimits{}, &entry).code(),
            StatusCode::kMalformed);
  EXPECT_EQ(entry.admission, "untouched") << "errors leave the output alone";
  ASSERT_TRUE(decode_etcd_registry_entry(as_bytes(with_admission(msgpack::object("token", zone))), DecodeLimits{},
                                         &entry)
                  .is_ok());
  EXPECT_EQ(entry.admission, "token");
}

// The fuzzer's seed (tests/fuzz/make_corpus.py "etcd_registry_entry") is such a value.
TEST(EtcdRegistryEntry, TheSeedCorpusValueDecodes) {
  std::ifstream f(pdr::test::source_path("tests/fuzz/corpus/discovery_message/etcd_registry_entry.msgpack"),
                  std::ios::binary);
  ASSERT_TRUE(f);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EtcdRegistryEntry entry;
  ASSERT_TRUE(decode_etcd_registry_entry(as_bytes(bytes), DecodeLimits{}, &entry).is_ok());
  EXPECT_EQ(entry.admission, "curve");
  EXPECT_EQ(entry.registration.http_address.to_string(), "127.0.10.9:8000");
  EXPECT_EQ(entry.registration.connector, Connector::kNixl);
}

}  // namespace
}  // namespace pdr::proto
