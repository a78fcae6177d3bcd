// GET /debug/cache: query parsing (precise 400s) and the answer's shape.
#include "router/debug_cache.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <numeric>

namespace pdr::router {
namespace {

std::string error_of(std::string_view query) {
  DebugCacheQuery q;
  Status s = parse_debug_cache_query(query, &q);
  EXPECT_FALSE(s.is_ok()) << query;
  return s.message();
}

TEST(DebugCacheQuery, ParsesTokensAndLora) {
  DebugCacheQuery q;
  ASSERT_TRUE(parse_debug_cache_query("tokens=1,2,4294967295&lora=my%20adapter", &q).is_ok());
  EXPECT_EQ(q.tokens, (std::vector<uint32_t>{1, 2, 4294967295u}));
  EXPECT_EQ(q.lora, std::optional<std::string>("my adapter"));
  ASSERT_TRUE(parse_debug_cache_query("tokens=7%2C8", &q).is_ok());
  EXPECT_EQ(q.tokens, (std::vector<uint32_t>{7, 8}));
  EXPECT_FALSE(q.lora.has_value());
}

TEST(DebugCacheQuery, RefusesBadInputPrecisely) {
  EXPECT_EQ(error_of(""), "tokens: missing; expected ?tokens=1,2,3[&lora=NAME]");
  EXPECT_EQ(error_of("tokens="), "tokens: empty; expected comma-separated token ids, e.g. tokens=1,2,3");
  EXPECT_EQ(error_of("tokens=1,-2"), "tokens[1]: '-2' is not an integer 0..4294967295");
  EXPECT_EQ(error_of("tokens=4294967296"), "tokens[0]: '4294967296' is not an integer 0..4294967295");
  EXPECT_EQ(error_of("tokens=1,,2"), "tokens[1]: '' is not an integer 0..4294967295");
  EXPECT_EQ(error_of("tokens=1,2,"), "tokens[2]: '' is not an integer 0..4294967295");
  EXPECT_EQ(error_of("tokens=1x"), "tokens[0]: '1x' is not an integer 0..4294967295");
  EXPECT_EQ(error_of("tokens=1&tokens=2"), "tokens: given twice");
  EXPECT_EQ(error_of("tokens=%zz"), "tokens: bad percent-encoding");
  EXPECT_EQ(error_of("tokens=1&model=x"), "unknown parameter 'model' (expected tokens, lora)");
  EXPECT_EQ(error_of("tokens=1&lora=" + std::string(257, 'a')), "lora: 257 bytes, limit 256");
  std::string many = "tokens=0";
  for (size_t i = 1; i <= kMaxDebugCacheTokens; ++i) many += ",0";
  EXPECT_EQ(error_of(many), "tokens: more than 1048576 token ids");
}

TEST(DebugCacheResponse, LongestFirstAndErrors) {
  cache::BlockIndex index;
  proto::KvEventBatch batch;
  proto::KvEvent e;
  e.kind = proto::KvEventKind::kBlockStored;
  e.block_hashes = {1, 2};
  e.token_ids.resize(8);
  std::iota(e.token_ids.begin(), e.token_ids.end(), 0u);
  e.block_size = 4;
  batch.events.push_back(e);
  index.apply("127.0.0.1:8200", 0, batch);
  batch.events[0].block_hashes = {1};
  batch.events[0].token_ids.resize(4);
  index.apply("127.0.0.1:8100", 0, batch);

  const http::Response ok = debug_cache_response("tokens=0,1,2,3,4,5,6,7,8", &index);
  ASSERT_EQ(ok.status, 200);
  const auto doc = nlohmann::json::parse(ok.body);
  EXPECT_EQ(doc["tokens"], 9);
  ASSERT_EQ(doc["nodes"].size(), 2u);
  EXPECT_EQ(doc["nodes"][0]["node"], "127.0.0.1:8200");
  EXPECT_EQ(doc["nodes"][0]["matched_blocks"], 2);
  EXPECT_EQ(doc["nodes"][0]["block_size"], 4);
  EXPECT_EQ(doc["nodes"][0]["matched_tokens"], 8);
  EXPECT_EQ(doc["nodes"][0]["gpu_blocks"], 2);
  EXPECT_EQ(doc["nodes"][0]["cached_tokens"], 8);
  EXPECT_EQ(doc["nodes"][1]["node"], "127.0.0.1:8100");
  EXPECT_EQ(doc["lora_known"], false);

  // A node whose blocks are on a CPU tier only: held, at a discount; an adapter's name is known.
  batch.events[0].medium = "CPU";
  batch.events[0].lora_name = "adapter-a";
  index.apply("127.0.0.1:8300", 0, batch);
  const auto lora = nlohmann::json::parse(debug_cache_response("tokens=0,1,2,3&lora=adapter-a", &index).body);
  EXPECT_EQ(lora["lora_known"], true);
  ASSERT_EQ(lora["nodes"].size(), 1u);
  EXPECT_EQ(lora["nodes"][0]["node"], "127.0.0.1:8300");
  EXPECT_EQ(lora["nodes"][0]["matched_blocks"], 1);
  EXPECT_EQ(lora["nodes"][0]["gpu_blocks"], 0);
  EXPECT_EQ(lora["nodes"][0]["cached_tokens"], 4 * cache::kOffloadWeightPercent / 100);

  const http::Response bad = debug_cache_response("tokens=a", &index);
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("\"code\":\"bad_tokens\""), std::string::npos) << bad.body;
  EXPECT_EQ(debug_cache_response("tokens=1", nullptr).status, 404);
}

}  // namespace
}  // namespace pdr::router
