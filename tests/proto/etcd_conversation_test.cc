#include "proto/etcd_conversation.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

EtcdConversationEntry sample() {
  EtcdConversationEntry e;
  e.writer = "replica-a";
  e.binding = std::string(kConversationBindingBytes, '\x5a');
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

TEST(EtcdConversation, BindingsRoundTripAsText) {
  const std::string alice(kConversationBindingBytes, '\xa1');
  EXPECT_EQ(conversation_binding_text(""), "anonymous");
  std::string hex;
  for (size_t i = 0; i < kConversationBindingBytes; ++i) hex += "a1";
  EXPECT_EQ(conversation_binding_text(alice), hex);
  std::string back = "untouched";
  ASSERT_TRUE(parse_conversation_binding_text(hex, &back));
  EXPECT_EQ(back, alice);
  ASSERT_TRUE(parse_conversation_binding_text("anonymous", &back));
  EXPECT_EQ(back, "");
  back = "untouched";
  for (std::string bad : {std::string(""), std::string("Anonymous"), hex.substr(2), hex + "00", std::string(64, 'A'),
                          std::string(63, 'a') + "g"}) {
    EXPECT_FALSE(parse_conversation_binding_text(bad, &back)) << bad;
  }
  EXPECT_EQ(back, "untouched");
}

TEST(EtcdConversation, KeyRoundTripsUnderThePrefix) {
  const std::string alice(kConversationBindingBytes, '\x07');
  for (const std::string& binding : {std::string(), alice}) {
    const std::string key = etcd_conversation_key("/pdrouter/", binding, "conv/with slashes");
    const std::string folder = "/pdrouter/conversations/" + conversation_binding_text(binding) + "/";
    EXPECT_EQ(key.rfind(folder, 0), 0u) << key;
    EXPECT_EQ(key.find('/', folder.size()), std::string::npos);
    std::string got_binding = "untouched", id;
    ASSERT_TRUE(parse_etcd_conversation_key("/pdrouter/", key, &got_binding, &id).is_ok());
    EXPECT_EQ(got_binding, binding);
    EXPECT_EQ(id, "conv/with slashes");
  }
  // One id, two clients: two keys.
  EXPECT_NE(etcd_conversation_key("/p/", "", "c"), etcd_conversation_key("/p/", alice, "c"));
}

TEST(EtcdConversation, ForeignOrBadKeysAreRefused) {
  std::string binding = "untouched", id = "untouched";
  auto parse = [&](const std::string& key) { return parse_etcd_conversation_key("/pdrouter/", key, &binding, &id).code(); };
  EXPECT_EQ(parse("/pdrouter/nodes/r/n"), StatusCode::kInvalidValue);
  EXPECT_EQ(parse("/other/conversations/anonymous/YQ"), StatusCode::kInvalidValue);
  EXPECT_EQ(parse("/pdrouter/conversations/"), StatusCode::kMalformed);
  EXPECT_EQ(parse("/pdrouter/conversations/anonymous/"), StatusCode::kMalformed);
  EXPECT_EQ(parse("/pdrouter/conversations/anonymous/a/b"), StatusCode::kMalformed);
  EXPECT_EQ(parse("/pdrouter/conversations/anonymous/" + std::string(2000, 'A')), StatusCode::kTooLarge);
  // A key from before bindings (the id right under conversations/), and bindings that are not one.
  EXPECT_EQ(parse("/pdrouter/conversations/YQ"), StatusCode::kMalformed);
  EXPECT_EQ(parse("/pdrouter/conversations/abcd/YQ"), StatusCode::kMalformed);
  EXPECT_EQ(parse("/pdrouter/conversations/" + std::string(64, 'F') + "/YQ"), StatusCode::kMalformed);
  EXPECT_EQ(binding, "untouched");
  EXPECT_EQ(id, "untouched");
}

TEST(EtcdConversation, EntryRoundTrips) {
  const EtcdConversationEntry e = sample();
  EtcdConversationEntry back;
  ASSERT_TRUE(parse_etcd_conversation(encode_etcd_conversation(e), &back).is_ok());
  EXPECT_EQ(back.writer, e.writer);
  EXPECT_EQ(back.binding, e.binding);
  EXPECT_EQ(back.decode_key, e.decode_key);
  EXPECT_EQ(back.decode_epoch, e.decode_epoch);
  EXPECT_EQ(back.expires_unix_ms, e.expires_unix_ms);
  EXPECT_EQ(back.prefill_params, e.prefill_params);
  // The anonymous binding too; the value holds the binding's text, never raw bytes.
  EtcdConversationEntry anonymous = sample();
  anonymous.binding.clear();
  const std::string value = encode_etcd_conversation(anonymous);
  EXPECT_NE(value.find(R"("binding":"anonymous")"), std::string::npos) << value;
  back = sample();
  ASSERT_TRUE(parse_etcd_conversation(value, &back).is_ok());
  EXPECT_EQ(back.binding, "");
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
      {R"({"writer":"w","binding":"anonymous","epoch":1,"expires_ms":5,)" + params + "}", StatusCode::kMissingKey},
      {R"({"writer":"w","binding":"anonymous","decode":"d","expires_ms":5,)" + params + "}", StatusCode::kMissingKey},
      {R"({"writer":"w","binding":"anonymous","decode":"d","epoch":1,)" + params + "}", StatusCode::kMissingKey},
      {R"({"writer":"w","binding":"anonymous","decode":"d","epoch":1,"expires_ms":5})", StatusCode::kMissingKey},
      {R"({"writer":1,"decode":"d","epoch":1,"expires_ms":5,)" + params + "}", StatusCode::kWrongType},
      {R"({"writer":"w","binding":"anonymous","decode":"","epoch":1,"expires_ms":5,)" + params + "}", StatusCode::kInvalidValue},
      {R"({"writer":"w","binding":"anonymous","decode":"d","epoch":-1,"expires_ms":5,)" + params + "}", StatusCode::kWrongType},
      {R"({"writer":"w","binding":"anonymous","decode":"d","epoch":1.5,"expires_ms":5,)" + params + "}", StatusCode::kWrongType},
      {R"({"writer":"w","binding":"anonymous","decode":"d","epoch":"1","expires_ms":5,)" + params + "}", StatusCode::kWrongType},
      // Over uint64: the JSON parser itself refuses the number.
      {R"({"writer":"w","binding":"anonymous","decode":"d","epoch":18446744073709551616,"expires_ms":5,)" + params + "}",
       StatusCode::kMalformed},
      {R"({"writer":"w","binding":"anonymous","decode":"d","epoch":1,"expires_ms":0,)" + params + "}", StatusCode::kOutOfRange},
      {R"({"writer":"w","binding":"anonymous","decode":"d","epoch":1,"expires_ms":"5",)" + params + "}", StatusCode::kWrongType},
      {R"({"writer":"w","binding":"anonymous","decode":"d","epoch":1,"expires_ms":5,"params":[1]})", StatusCode::kWrongType},
      {R"({"writer":"w","binding":"anonymous","decode":"d","epoch":1,"expires_ms":5,"params":"x"})", StatusCode::kWrongType},
      {R"({"writer":")" + std::string(2000, 'w') + R"(","decode":"d","epoch":1,"expires_ms":5,)" + params + "}",
       StatusCode::kTooLarge},
      {std::string(kMaxConversationValueBytes + 1, ' '), StatusCode::kTooLarge},
      // An entry from before bindings, and bindings that are not one.
      {R"({"writer":"w","decode":"d","epoch":1,"expires_ms":5,)" + params + "}", StatusCode::kMissingKey},
      {R"({"writer":"w","binding":1,"decode":"d","epoch":1,"expires_ms":5,)" + params + "}", StatusCode::kWrongType},
      {R"({"writer":"w","binding":"","decode":"d","epoch":1,"expires_ms":5,)" + params + "}", StatusCode::kInvalidValue},
      {R"({"writer":"w","binding":"Anonymous","decode":"d","epoch":1,"expires_ms":5,)" + params + "}",
       StatusCode::kInvalidValue},
      {R"({"writer":"w","binding":")" + std::string(62, 'a') + R"(","decode":"d","epoch":1,"expires_ms":5,)" + params +
           "}",
       StatusCode::kInvalidValue},
      {R"({"writer":"w","binding":")" + std::string(64, 'A') + R"(","decode":"d","epoch":1,"expires_ms":5,)" + params +
           "}",
       StatusCode::kInvalidValue},
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
                   R"({"writer":"w","binding":"anonymous","decode":"d","epoch":1,"expires_ms":5,"params":{"a":)" + deep + "}}", &out)
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
