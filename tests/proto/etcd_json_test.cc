#include "proto/etcd_json.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::proto {
namespace {

TEST(EtcdJson, Base64RoundTripsEveryLengthAndRefusesNonCanonicalText) {
  std::string bytes;
  for (int i = 0; i < 70; ++i) {
    std::string decoded;
    ASSERT_TRUE(base64_decode(base64_encode(bytes), &decoded)) << i;
    EXPECT_EQ(decoded, bytes);
    bytes.push_back(static_cast<char>(i * 37));
  }
  EXPECT_EQ(base64_encode("pdr/a"), "cGRyL2E=");
  std::string out = "untouched";
  for (const char* bad : {"cGRyL2E", "cGRyL2E==", "cG=yL2E=", "cGRy\nL2E=", "cGRyL2F=", "c===", "*GRy"}) {
    EXPECT_FALSE(base64_decode(bad, &out)) << bad;
  }
  EXPECT_EQ(out, "untouched");
}

TEST(EtcdJson, PrefixEndIncrementsTheLastByteBelow0xff) {
  EXPECT_EQ(etcd_prefix_end("pdr/"), "pdr0");
  EXPECT_EQ(etcd_prefix_end(std::string("a\xff\xff", 3)), "b");
  EXPECT_EQ(etcd_prefix_end(""), std::string(1, '\0'));
}

TEST(EtcdJson, EncodesRequestsAsTheGatewayReadsThem) {
  EXPECT_EQ(encode_etcd_put("pdr/a", "hello", 0), R"({"key":"cGRyL2E=","value":"aGVsbG8="})");
  EXPECT_EQ(encode_etcd_put("k", "", 42), R"({"key":"aw==","value":"","lease":"42"})");
  EXPECT_EQ(encode_etcd_range("pdr/", "pdr0"), R"({"key":"cGRyLw==","range_end":"cGRyMA=="})");
  EXPECT_EQ(encode_etcd_delete_range("k", ""), R"({"key":"aw=="})");
  EXPECT_EQ(encode_etcd_lease_grant(5), R"({"TTL":"5"})");
  EXPECT_EQ(encode_etcd_lease_id(-7), R"({"ID":"-7"})");
  EXPECT_EQ(encode_etcd_watch_create("pdr/", "pdr0", 9),
            R"({"create_request":{"key":"cGRyLw==","range_end":"cGRyMA==","start_revision":"9"}})");
  EXPECT_EQ(encode_etcd_authenticate("r\"oot", "p\\w\n"), R"({"name":"r\"oot","password":"p\\w\u000a"})");
}

TEST(EtcdJson, DecodesARangeAnswer) {
  EtcdRangeAnswer range;
  ASSERT_TRUE(parse_etcd_range(
      R"({"header":{"cluster_id":"15118495548433857066","revision":"2","raft_term":"2"},"kvs":[{"key":"cGRyL2E=","create_revision":"2","mod_revision":"2","version":"1","value":"aGVsbG8=","lease":"4111120253772303623"}],"count":"1"})",
      &range).is_ok());
  EXPECT_EQ(range.answer.revision, 2);
  EXPECT_FALSE(range.answer.is_error);
  ASSERT_EQ(range.kvs.size(), 1u);
  EXPECT_EQ(range.kvs[0].key, "pdr/a");
  EXPECT_EQ(range.kvs[0].value, "hello");
  EXPECT_EQ(range.kvs[0].lease, 4111120253772303623);
  EXPECT_EQ(range.kvs[0].mod_revision, 2);
  // An empty range leaves "kvs" out.
  ASSERT_TRUE(parse_etcd_range(R"({"header":{"revision":"3"}})", &range).is_ok());
  EXPECT_TRUE(range.kvs.empty());
  EXPECT_EQ(range.answer.revision, 3);
}

TEST(EtcdJson, DecodesErrorsInBothForms) {
  EtcdAnswer answer;
  ASSERT_TRUE(parse_etcd_answer(
      R"({"error":"etcdserver: requested lease not found","message":"etcdserver: requested lease not found","code":5})",
      &answer).is_ok());
  EXPECT_TRUE(answer.is_error);
  EXPECT_EQ(answer.grpc_code, 5);
  EXPECT_EQ(answer.error, "etcdserver: requested lease not found");
  EtcdWatchAnswer watch;
  ASSERT_TRUE(parse_etcd_watch(R"({"error":{"grpc_code":14,"http_code":503,"message":"transport closing"}})",
                               &watch).is_ok());
  EXPECT_TRUE(watch.answer.is_error);
  EXPECT_EQ(watch.answer.grpc_code, 14);
  EXPECT_EQ(watch.answer.error, "transport closing");
}

TEST(EtcdJson, DecodesLeaseGrantAndKeepalive) {
  EtcdLeaseAnswer lease;
  ASSERT_TRUE(parse_etcd_lease(R"({"header":{"revision":"1"},"ID":"4111120253772303621","TTL":"5"})", &lease).is_ok());
  EXPECT_EQ(lease.id, 4111120253772303621);
  EXPECT_EQ(lease.ttl, 5);
  ASSERT_TRUE(parse_etcd_lease(R"({"result":{"header":{"revision":"2"},"ID":"77","TTL":"5"}})", &lease).is_ok());
  EXPECT_EQ(lease.id, 77);
  EXPECT_EQ(lease.ttl, 5);
  EXPECT_EQ(lease.answer.revision, 2);
  // An unknown or expired lease: no TTL.
  ASSERT_TRUE(parse_etcd_lease(R"({"result":{"header":{"revision":"2"},"ID":"12345"}})", &lease).is_ok());
  EXPECT_EQ(lease.ttl, 0);
  EXPECT_FALSE(parse_etcd_lease(R"({"ID":"1","TTL":"-3"})", &lease).is_ok());
}

TEST(EtcdJson, DecodesWatchCreatedEventsAndCompaction) {
  EtcdWatchAnswer watch;
  ASSERT_TRUE(parse_etcd_watch(R"({"result":{"header":{"revision":"3"},"created":true}})", &watch).is_ok());
  EXPECT_TRUE(watch.created);
  EXPECT_EQ(watch.answer.revision, 3);
  ASSERT_TRUE(parse_etcd_watch(
      R"({"result":{"header":{"revision":"3"},"events":[{"kv":{"key":"cGRyL2E=","create_revision":"2","mod_revision":"2","version":"1","value":"aGVsbG8=","lease":"41"}},{"type":"DELETE","kv":{"key":"cGRyL2E=","mod_revision":"3"}}]}})",
      &watch).is_ok());
  ASSERT_EQ(watch.events.size(), 2u);
  EXPECT_FALSE(watch.events[0].is_delete);
  EXPECT_EQ(watch.events[0].kv.value, "hello");
  EXPECT_EQ(watch.events[0].kv.lease, 41);
  EXPECT_TRUE(watch.events[1].is_delete);
  EXPECT_EQ(watch.events[1].kv.key, "pdr/a");
  EXPECT_EQ(watch.events[1].kv.mod_revision, 3);
  ASSERT_TRUE(parse_etcd_watch(R"({"result":{"header":{"revision":"5"},"canceled":true,"compact_revision":"4"}})",
                               &watch).is_ok());
  EXPECT_TRUE(watch.canceled);
  EXPECT_EQ(watch.compact_revision, 4);
}

// What a writer stores is data, not the answer's shape: a key or value over its limit (or a
// value that is not base64) refuses that key-value alone, and the rest of the answer is read.
TEST(EtcdJson, RefusesOneKeyValueNotTheWholeAnswer) {
  const std::string big = base64_encode(std::string(kMaxEtcdValueBytes + 1, 'v'));
  const std::string long_key = base64_encode(std::string(kMaxEtcdKeyBytes + 1, 'k'));
  const std::string json = R"({"header":{"revision":"7"},"more":true,"kvs":[)"
                           R"({"key":"cGRyL2E=","mod_revision":"5","value":")" + big + R"("},)"
                           R"({"key":"cGRyL2I=","mod_revision":"6","value":"not base64"},)"
                           R"({"key":"cGRyL2M=","mod_revision":"7","value":"aGVsbG8="},)"
                           R"({"key":")" + long_key + R"(","mod_revision":"7","value":"aGVsbG8="}]})";
  EtcdRangeAnswer range;
  ASSERT_TRUE(parse_etcd_range(json, &range).is_ok());
  EXPECT_EQ(range.answer.revision, 7);
  EXPECT_TRUE(range.more);
  ASSERT_EQ(range.kvs.size(), 3u);
  EXPECT_EQ(range.kvs[0].key, "pdr/a");
  EXPECT_EQ(range.kvs[0].value, "");
  EXPECT_EQ(range.kvs[0].refused, "etcd answer: value over 1048576 bytes");
  EXPECT_EQ(range.kvs[0].mod_revision, 5);
  EXPECT_EQ(range.kvs[1].key, "pdr/b");
  EXPECT_EQ(range.kvs[1].refused, "etcd answer: 'value' is not base64");
  EXPECT_EQ(range.kvs[2].value, "hello");
  EXPECT_EQ(range.kvs[2].refused, "");
  EXPECT_EQ(range.skipped, 1u) << "the key over its limit";
  EXPECT_EQ(range.last_key, std::string(kMaxEtcdKeyBytes + 1, 'k')) << "the next page starts after it";

  EtcdWatchAnswer watch;
  ASSERT_TRUE(parse_etcd_watch(R"({"result":{"header":{"revision":"8"},"events":[)"
                               R"({"kv":{"key":"cGRyL2E=","mod_revision":"8","value":")" + big + R"("}},)"
                               R"({"kv":{"key":")" + long_key + R"(","mod_revision":"8"}},)"
                               R"({"type":"DELETE","kv":{"key":"cGRyL2I=","mod_revision":"8"}}]}})",
                               &watch).is_ok());
  ASSERT_EQ(watch.events.size(), 2u);
  EXPECT_EQ(watch.events[0].kv.refused, "etcd answer: value over 1048576 bytes");
  EXPECT_TRUE(watch.events[1].is_delete);
  EXPECT_EQ(watch.skipped, 1u);
}

TEST(EtcdJson, EncodesRangePages) {
  EXPECT_EQ(encode_etcd_range_page("pdr/", "pdr0", {}), encode_etcd_range("pdr/", "pdr0"));
  EXPECT_EQ(encode_etcd_range_page("pdr/", "pdr0", {.limit = 256, .revision = 9, .keys_only = false}),
            R"({"key":"cGRyLw==","range_end":"cGRyMA==","limit":"256","revision":"9"})");
  EXPECT_EQ(encode_etcd_range_page(std::string("pdr/a\0", 6), "pdr0", {.limit = 1, .revision = 0, .keys_only = true}),
            R"({"key":"cGRyL2EA","range_end":"cGRyMA==","limit":"1","keys_only":true})");
}

TEST(EtcdJson, RefusesAnswersItCannotTrust) {
  struct Case {
    const char* json;
    StatusCode code;
  } cases[] = {
      {"{", StatusCode::kMalformed},
      {"[]", StatusCode::kWrongType},
      {R"({"header":[]})", StatusCode::kWrongType},
      {R"({"header":{"revision":"x"}})", StatusCode::kOutOfRange},
      {R"({"header":{"revision":"99999999999999999999"}})", StatusCode::kOutOfRange},
      {R"({"header":{"revision":true}})", StatusCode::kWrongType},
      {R"({"kvs":{}})", StatusCode::kWrongType},
      {R"({"kvs":[1]})", StatusCode::kWrongType},
      {R"({"kvs":[{"key":"!!!!"}]})", StatusCode::kMalformed},
      {R"({"kvs":[{"value":"aGVsbG8="}]})", StatusCode::kMissingKey},
      {R"({"kvs":[{"key":7}]})", StatusCode::kWrongType},
  };
  for (const Case& c : cases) {
    EtcdRangeAnswer range;
    range.answer.revision = 99;
    Status st = parse_etcd_range(c.json, &range);
    EXPECT_EQ(st.code(), c.code) << c.json << ": " << st.message();
    EXPECT_EQ(range.answer.revision, 99) << c.json;
  }
  EtcdWatchAnswer watch;
  EXPECT_EQ(parse_etcd_watch(R"({"result":{"events":[{"type":"BOOM","kv":{"key":"aw=="}}]}})", &watch).code(),
            StatusCode::kInvalidValue);
  EXPECT_EQ(parse_etcd_watch(R"({"result":{"events":[{"type":"DELETE"}]}})", &watch).code(),
            StatusCode::kMissingKey);
  std::string token;
  EtcdAnswer answer;
  EXPECT_EQ(parse_etcd_token(R"({"token":"a b"})", &answer, &token).code(), StatusCode::kInvalidValue);
  ASSERT_TRUE(parse_etcd_token(R"({"header":{},"token":"abc.7"})", &answer, &token).is_ok());
  EXPECT_EQ(token, "abc.7");
}

TEST(EtcdJson, LineSplitterYieldsWholeLinesAcrossReads) {
  EtcdLineSplitter splitter(16);
  std::string_view line;
  ASSERT_TRUE(splitter.feed("{\"a\":1}\n{\"b\""));
  ASSERT_TRUE(splitter.next_line(&line));
  EXPECT_EQ(line, "{\"a\":1}");
  EXPECT_FALSE(splitter.next_line(&line));
  ASSERT_TRUE(splitter.feed(":2}\r\n\n"));
  ASSERT_TRUE(splitter.next_line(&line));
  EXPECT_EQ(line, "{\"b\":2}");
  EXPECT_FALSE(splitter.next_line(&line));
  // A line that grows past the limit without a newline breaks the stream.
  EXPECT_FALSE(splitter.feed(std::string(17, 'x')));
  EXPECT_FALSE(splitter.feed("\n"));
  EXPECT_FALSE(splitter.next_line(&line));
}

}  // namespace
}  // namespace pdr::proto
