#include "router/routing/decode_alone.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::router::routing {
namespace {

const proto::Dialect* nixl() { return proto::dialect_for(proto::Connector::kNixl, proto::TransferMode::kNone); }
const proto::Dialect* mooncake() {
  return proto::dialect_for(proto::Connector::kMooncake, proto::TransferMode::kNone);
}

config::Topology::ConditionalDisaggregation config(uint32_t max_prompt_tokens, uint32_t min_cached_percent) {
  config::Topology::ConditionalDisaggregation c;
  c.enabled = true;
  c.max_prompt_tokens = max_prompt_tokens;
  c.min_cached_percent = min_cached_percent;
  return c;
}

TEST(DecodeAlone, EstimatesTokensWithoutATokenizer) {
  EXPECT_EQ(estimated_prompt_tokens("[1,2,3]"), 3u);
  EXPECT_EQ(estimated_prompt_tokens("\"" + std::string(398, 'a') + "\""), 100u);
  EXPECT_EQ(estimated_prompt_tokens("\"\""), 1u);
}

TEST(DecodeAlone, ShortPromptsGoToTheDecodeAlone) {
  ASSERT_NE(nixl(), nullptr);
  EXPECT_EQ(decode_alone_reason(config(8, 0), nixl(), "[1,2,3,4,5,6,7,8]", nullptr, "127.0.32.1:1"),
            DecodeAloneReason::kShortPrompt);
  EXPECT_EQ(decode_alone_reason(config(8, 0), nixl(), "[1,2,3,4,5,6,7,8,9]", nullptr, "127.0.32.1:1"),
            std::nullopt);
  EXPECT_EQ(decode_alone_reason(config(8, 0), nixl(), "\"a short text\"", nullptr, "127.0.32.1:1"),
            DecodeAloneReason::kShortPrompt);
}

TEST(DecodeAlone, ADecodeHoldingNearlyAllOfThePromptServesItAlone) {
  CacheHits hits;
  hits.prompt_units = 100;
  hits.nodes = {{"127.0.32.1:1", 95}, {"127.0.32.2:1", 50}};
  const std::string prompt = "\"" + std::string(400, 'x') + "\"";
  EXPECT_EQ(decode_alone_reason(config(0, 90), nixl(), prompt, &hits, "127.0.32.1:1"), DecodeAloneReason::kCached);
  EXPECT_EQ(decode_alone_reason(config(0, 90), nixl(), prompt, &hits, "127.0.32.2:1"), std::nullopt);
  EXPECT_EQ(decode_alone_reason(config(0, 90), nixl(), prompt, nullptr, "127.0.32.1:1"), std::nullopt);
}

TEST(DecodeAlone, NeverWhenOffOrWhenTheDecodeCannotComputeAlone) {
  auto off = config(1000, 1);
  off.enabled = false;
  EXPECT_EQ(decode_alone_reason(off, nixl(), "[1]", nullptr, "127.0.32.1:1"), std::nullopt);
  ASSERT_NE(mooncake(), nullptr);
  EXPECT_EQ(mooncake()->without_kv, nullptr);
  EXPECT_EQ(decode_alone_reason(config(1000, 0), mooncake(), "[1]", nullptr, "127.0.32.1:1"), std::nullopt);
  EXPECT_EQ(decode_alone_reason(config(1000, 0), nullptr, "[1]", nullptr, "127.0.32.1:1"), std::nullopt);
  EXPECT_EQ(decode_alone_reason(config(0, 0), nixl(), "[1]", nullptr, "127.0.32.1:1"), std::nullopt);
}

}  // namespace
}  // namespace pdr::router::routing
