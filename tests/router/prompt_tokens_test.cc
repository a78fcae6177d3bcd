// Prompt token counts for the load ledger (router/policies/prompt_tokens.h): token id arrays
// counted exactly, text estimated at four bytes a token, a node's cache hit taken off in tokens
// (KV events) or in the prompt's share of bytes (prefix tree).
#include "router/policies/prompt_tokens.h"

#include <gtest/gtest.h>

namespace pdr::router {
namespace {

TEST(PromptTokens, TokenIdArraysAreCountedExactly) {
  const PromptTokens p = count_prompt_tokens("[1, 22,333 ,4444]");
  EXPECT_EQ(p.count, 4u);
  EXPECT_EQ(p.source, PromptTokens::Source::kTokenIds);
  EXPECT_EQ(count_prompt_tokens(" [7]").count, 1u);
}

TEST(PromptTokens, TextAndEverythingElseIsEstimatedFromBytes) {
  const PromptTokens text = count_prompt_tokens("\"" + std::string(398, 'a') + "\"");
  EXPECT_EQ(text.count, 100u);
  EXPECT_EQ(text.source, PromptTokens::Source::kEstimate);
  EXPECT_EQ(count_prompt_tokens(R"([{"role":"user","content":"hello there"}])").source,
            PromptTokens::Source::kEstimate);
  EXPECT_EQ(count_prompt_tokens("[[1,2],[3,4]]").source, PromptTokens::Source::kEstimate);  // a batch
  EXPECT_EQ(count_prompt_tokens("[-1, 2]").source, PromptTokens::Source::kEstimate);
  EXPECT_EQ(count_prompt_tokens("[]").source, PromptTokens::Source::kEstimate);
  EXPECT_EQ(count_prompt_tokens("[1, 2").source, PromptTokens::Source::kEstimate);  // not closed
  EXPECT_EQ(count_prompt_tokens("\"a\"").count, 1u);  // never 0 for a prompt
  EXPECT_EQ(count_prompt_tokens("").count, 0u);
  EXPECT_EQ(count_prompt_tokens("null").count, 0u);
}

TEST(PromptTokens, UncachedTakesOffTheNodesHit) {
  PromptTokens p{1000, 4000, PromptTokens::Source::kTokenIds};
  EXPECT_EQ(uncached_tokens(p, nullptr, "a"), 1000u);
  CacheHits kv;
  kv.source = CacheHits::Source::kKvEvents;
  kv.prompt_units = 1000;
  kv.nodes = {{"a", 640}, {"b", 5000}};
  EXPECT_EQ(uncached_tokens(p, &kv, "a"), 360u);
  EXPECT_EQ(uncached_tokens(p, &kv, "b"), 0u);  // never below zero
  EXPECT_EQ(uncached_tokens(p, &kv, "c"), 1000u);
  CacheHits tree;
  tree.source = CacheHits::Source::kPrefixTree;
  tree.nodes = {{"a", 1000}};  // a quarter of the prompt's bytes
  EXPECT_EQ(uncached_tokens(p, &tree, "a"), 750u);
}

}  // namespace
}  // namespace pdr::router
