#include "proto/etcd_conversation.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

EtcdConversationEntry sample() {
  EtcdConversationEntry e;
  e.writer = "replica-a";
  e.decode_key = "127.0.30.2:8200";
  e.decode_epoch = 18446744073709551615ull;  // the whole uint64 range survives
  e.expires_unix_ms = 1'795'000'000'000;
  e.prefill_params = R"({"do_remote_decode":true,"remote_block_ids":[[1,2]],"remote_host":"127.0.30.2"})";
  return e;
}

TEST(EtcdConversation, Base64UrlRoundTripsAnyBytes) {
  for (std::string bytes : {std::string(""), std::string("a"), std::string("ab"), std::string("abc"),
                            std::string("conv/1?x=y&z"), std::string("\xff\xfe\x00\x01", 4)}) {
    const std::string text = base64url_encode(bytes);
    EXPECT_EQ(text.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"),
              std::string::npos)
        << text;
    std::string back;
    ASSERT_TRUE(base64url_decode(text, &back)) << text;
    EXPECT_EQ(back, bytes);
  }
  EXPECT_EQ(base64url_encode("\xfb\xff"), "-_8");
}

TEST(EtcdConversation, Base64UrlDecodeIsStrict) {
  std::string out = "untouched";
  for (std::string_view bad : {"YQ==", "Y", "YQ=", "a+b/", "YW J", "YR"}) {  // "YR": non-zero trailing bits
    EXPECT_FALSE(base64url_decode(bad, &out)) << bad;
  }
  EXPECT_EQ(out, "untouched");
}

TEST(EtcdConversation, KeyRoundTripsUnderThePrefix) {
  const std::string key = etcd_conversation_key("/pdrouter/", "conv/with slashes");
  EXPECT_EQ(key.rfind("/pdrouter/conversations/", 0), 0u);
  EXPECT_EQ(key.find('/', std::string("/pdrouter/conversations/").size()), std::string::npos);
  std::string id;
  ASSERT_TRUE(parse_etcd_conversation_key("/pdrouter/", key, &id).is_ok());
  EXPECT_EQ(id, "conv/with slashes");
}

TEST(EtcdConversation, ForeignOrBadKeysAreRefused) {
  std::string id = "untouched";
  EXPECT_EQ(parse_etcd_conversation_key("/pdrouter/", "/pdrouter/nodes/r/n", &id).code(), StatusCode::kInvalidValue);
  EXPECT_EQ(parse_etcd_conversation_key("/pdrouter/", "/other/conversations/YQ", &id).code(), StatusCode::kInvalidValue);
  EXPECT_EQ(parse_etcd_conversation_key("/pdrouter/", "/pdrouter/conversations/", &id).code(), StatusCode::kMalformed);
  EXPECT_EQ(parse_etcd_conversation_key("/pdrouter/", "/pdrouter/conversations/a/b", &id).code(), StatusCode::kMalformed);
  EXPECT_EQ(parse_etcd_conversation_key("/pdrouter/", "/pdrouter/conversations/" + std::string(2000, 'A'), &id).code(),
            StatusCode::kTooLarge);
  EXPECT_EQ(id, "untouched");
}

TEST(EtcdConversation, EntryRoundTrips) {
  const EtcdConversationEntry e = sample();
  EtcdConversationEntry back;
  ASSERT_TRUE(parse_etcd_conversation(encode_etcd_conversation(e), &back).is_ok());
  EXPECT_EQ(back.writer, e.writer);
  EXPECT_EQ(back.decode_key, e.decode_key);
  EXPECT_EQ(back.decode_epoch, e.decode_epoch);
  EXPECT_EQ(back.expires_unix_ms, e.expires_unix_ms);
  EXPECT_EQ(back.prefill_params, e.prefill_params);
}

TEST(EtcdConversation, BadEntriesAreRefusedAndLeaveTheOutputAlone) {
  struct Case {
    std::string value;
    StatusCode code;
  };
  const std::string params = R"("params":{"a":1})";
  const Case cases[] = {
      {"not json", StatusCode::kMalformed},
      {R"({"decode":"d","epoch":1,"expires_ms":5,)" + params + "}", StatusCode::kMissingKey},
      {R"({"writer":"w","epoch":1,"expires_ms":5,)" + params + "}", StatusCode::kMissingKey},
      {R"({"writer":"w","decode":"d","expires_ms":5,)" + params + "}", StatusCode::kMissingKey},
      {R"({"writer":"w","decode":"d","epoch":1,)" + params + "}", StatusCode::kMissingKey},
      {R"({"writer":"w","decode":"d","epoch":1,"expires_ms":5})", StatusCode::kMissingKey},
      {R"({"writer":1,"decode":"d","epoch":1,"expires_ms":5,)" + params + "}", StatusCode::kWrongType},
      {R"({"writer":"w","decode":"","epoch":1,"expires_ms":5,)" + params + "}", StatusCode::kInvalidValue},
      {R"({"writer":"w","decode":"d","epoch":-1,"expires_ms":5,)" + params + "}", StatusCode::kWrongType},
      {R"({"writer":"w","decode":"d","epoch":1.5,"expires_ms":5,)" + params + "}", StatusCode::kWrongType},
      {R"({"writer":"w","decode":"d","epoch":"1","expires_ms":5,)" + params + "}", StatusCode::kWrongType},
      // Over uint64: the JSON parser itself refuses the number.
      {R"({"writer":"w","decode":"d","epoch":18446744073709551616,"expires_ms":5,)" + params + "}",
       StatusCode::kMalformed},
      {R"({"writer":"w","decode":"d","epoch":1,"expires_ms":0,)" + params + "}", StatusCode::kOutOfRange},
      {R"({"writer":"w","decode":"d","epoch":1,"expires_ms":"5",)" + params + "}", StatusCode::kWrongType},
      {R"({"writer":"w","decode":"d","epoch":1,"expires_ms":5,"params":[1]})", StatusCode::kWrongType},
      {R"({"writer":"w","decode":"d","epoch":1,"expires_ms":5,"params":"x"})", StatusCode::kWrongType},
      {R"({"writer":")" + std::string(2000, 'w') + R"(","decode":"d","epoch":1,"expires_ms":5,)" + params + "}",
       StatusCode::kTooLarge},
      {std::string(kMaxConversationValueBytes + 1, ' '), StatusCode::kTooLarge},
  };
  for (const Case& c : cases) {
    EtcdConversationEntry out = sample();
    const Status st = parse_etcd_conversation(c.value, &out);
    EXPECT_EQ(st.code(), c.code) << c.value.substr(0, 120) << " -> " << st.message();
    EXPECT_EQ(out.writer, "replica-a");
  }
}

TEST(EtcdConversation, DeepParamsAreRefused) {
  std::string deep = std::string(40, '[') + std::string(40, ']');
  EtcdConversationEntry out;
  EXPECT_FALSE(parse_etcd_conversation(
                   R"({"writer":"w","decode":"d","epoch":1,"expires_ms":5,"params":{"a":)" + deep + "}}", &out)
                   .is_ok());
}

TEST(EtcdConversation, ALateDeleteNeverRemovesANewerLocalEntry) {
  using V = ConversationDeleteVerdict;
  // No put of this replica known (another writer's entry, or none): the delete applies.
  EXPECT_EQ(etcd_conversation_delete_verdict(50, 0, false), V::kApply);
  // Another replica took the entry this replica put at 40: gone here too.
  EXPECT_EQ(etcd_conversation_delete_verdict(50, 40, false), V::kApply);
  // The take's delete (40) was made before this replica's newer put (50): ignored.
  EXPECT_EQ(etcd_conversation_delete_verdict(40, 50, false), V::kIgnore);
  // A delete event without a revision cannot be newer than a known put.
  EXPECT_EQ(etcd_conversation_delete_verdict(0, 50, false), V::kIgnore);
  // A put in flight: its revision decides, later.
  EXPECT_EQ(etcd_conversation_delete_verdict(40, 0, true), V::kDefer);
  EXPECT_EQ(etcd_conversation_delete_verdict(60, 50, true), V::kDefer);
  // A put of another writer: stale only when older than this replica's own put.
  EXPECT_FALSE(etcd_conversation_put_is_stale(40, 0));
  EXPECT_TRUE(etcd_conversation_put_is_stale(40, 50));
  EXPECT_FALSE(etcd_conversation_put_is_stale(60, 50));
}

TEST(EtcdConversation, TheLeaseCoversTheTtl) {
  EXPECT_EQ(etcd_conversation_lease_seconds(450'000), 450);
  EXPECT_EQ(etcd_conversation_lease_seconds(450'001), 451);
  EXPECT_EQ(etcd_conversation_lease_seconds(1), 1);
  EXPECT_EQ(etcd_conversation_lease_seconds(0), 1);
}

}  // namespace
}  // namespace pdr::proto
