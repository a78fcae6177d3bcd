// Session affinity bindings in etcd (proto/etcd_session.h): keys and values round-trip, and
// anything else from etcd is refused with `out` untouched.
#include "proto/etcd_session.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

TEST(EtcdSession, KeysRoundTripAndStayUnderTheSessionsSegment) {
  const std::string binding(32, '\x7f');
  const std::string key = etcd_session_key("/pdr/", binding, "a/b c\xff");
  EXPECT_TRUE(key.starts_with("/pdr/conversations/session/7f7f"));
  std::string b, id;
  ASSERT_TRUE(parse_etcd_session_key("/pdr/", key, &b, &id).is_ok());
  EXPECT_EQ(b, binding);
  EXPECT_EQ(id, "a/b c\xff");
  ASSERT_TRUE(parse_etcd_session_key("/pdr/", etcd_session_key("/pdr/", "", "s"), &b, &id).is_ok());
  EXPECT_EQ(b, "");
  EXPECT_EQ(id, "s");
}

TEST(EtcdSession, RefusesKeysThatAreNotOnes) {
  std::string b = "keep", id = "keep";
  for (const std::string& key :
       {std::string("/pdr/conversations/anonymous/cw"), std::string("/other/conversations/session/anonymous/cw"),
        std::string("/pdr/conversations/session/anonymous"), std::string("/pdr/conversations/session/ANONYMOUS/cw"),
        std::string("/pdr/conversations/session/anonymous/"), std::string("/pdr/conversations/session/anonymous/c%w"),
        std::string("/pdr/conversations/session/abcd/cw"),
        "/pdr/conversations/session/anonymous/" + std::string(2000, 'A')}) {
    EXPECT_FALSE(parse_etcd_session_key("/pdr/", key, &b, &id).is_ok()) << key;
  }
  EXPECT_EQ(b, "keep");
  EXPECT_EQ(id, "keep");
}

TEST(EtcdSession, ValuesRoundTrip) {
  EtcdSessionEntry e{"replica-a", std::string(32, '\x01'), "127.0.0.1:8100", "127.0.0.1:8200", 1234};
  EtcdSessionEntry out;
  ASSERT_TRUE(parse_etcd_session(encode_etcd_session(e), &out).is_ok());
  EXPECT_EQ(out.writer, e.writer);
  EXPECT_EQ(out.binding, e.binding);
  EXPECT_EQ(out.prefill_key, e.prefill_key);
  EXPECT_EQ(out.decode_key, e.decode_key);
  EXPECT_EQ(out.expires_unix_ms, 1234);
}

TEST(EtcdSession, RefusesBadValuesLeavingOutUntouched) {
  EtcdSessionEntry out;
  out.writer = "keep";
  const std::string ok_tail = R"(,"prefill":"127.0.0.1:1","decode":"127.0.0.1:2","expires_ms":5})";
  for (const std::string& value :
       {std::string("{not json"), std::string("[]"), std::string(R"({"writer":"x","binding":"anonymous"})"),
        R"({"writer":"x","binding":"nobody")" + ok_tail,
        std::string(R"({"writer":"x","binding":"anonymous","prefill":"","decode":"127.0.0.1:2","expires_ms":5})"),
        std::string(R"({"writer":"x","binding":"anonymous","prefill":"a b","decode":"127.0.0.1:2","expires_ms":5})"),
        std::string(R"({"writer":"x","binding":"anonymous","prefill":"a","decode":"b","expires_ms":0})"),
        std::string(R"({"writer":"x","binding":"anonymous","prefill":"a","decode":"b","expires_ms":"5"})"),
        std::string(R"({"writer":"x","binding":"anonymous","prefill":"a","decode":"b"})"),
        R"({"writer":")" + std::string(5000, 'x') + "\"" + ok_tail}) {
    EXPECT_FALSE(parse_etcd_session(value, &out).is_ok()) << value.substr(0, 100);
  }
  EXPECT_EQ(out.writer, "keep");
}

}  // namespace
}  // namespace pdr::proto
