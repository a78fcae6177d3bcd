#include "router/cache/prefix_tree.h"

#include <gtest/gtest.h>

#include <string>

namespace pdr::router::cache {
namespace {

using namespace std::chrono_literals;
const PrefixTree::Clock::time_point kT0{};

size_t matched(const PrefixTree& tree, std::string_view prompt, std::string_view tenant) {
  for (const auto& m : tree.match(prompt)) {
    if (m.tenant == tenant) return m.matched_bytes;
  }
  return 0;
}

TEST(PrefixTree, EachTenantMatchesItsLongestCommonPrefix) {
  PrefixTree tree;
  tree.insert("Hello world", "127.0.0.1:8100", kT0);
  tree.insert("Hello there", "127.0.0.1:8200", kT0);
  const auto m = tree.match("Hello world, again");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].tenant, "127.0.0.1:8100");
  EXPECT_EQ(m[0].matched_bytes, 11u);
  EXPECT_EQ(m[1].tenant, "127.0.0.1:8200");
  EXPECT_EQ(m[1].matched_bytes, 6u);  // "Hello "
  EXPECT_TRUE(tree.match("Goodbye").empty());
  EXPECT_TRUE(tree.match("").empty());
}

TEST(PrefixTree, EdgesSplitWhereNewPromptsDiverge) {
  PrefixTree tree;
  tree.insert("abcdef", "A", kT0);
  EXPECT_EQ(matched(tree, "abc", "A"), 3u);  // the prompt ends inside an edge
  tree.insert("abc", "B", kT0);              // splits the edge at 3
  EXPECT_EQ(matched(tree, "abcdef", "A"), 6u);
  EXPECT_EQ(matched(tree, "abcdef", "B"), 3u);
  EXPECT_EQ(matched(tree, "abcxyz", "A"), 3u);
  EXPECT_EQ(tree.stats().bytes, 6u);  // splitting adds no text
  EXPECT_EQ(tree.stats().tree_nodes, 3u);  // root, "abc", "def"
}

TEST(PrefixTree, RemovingATenantDropsWhatOnlyItHeld) {
  PrefixTree tree;
  tree.insert("abcdef", "A", kT0);
  tree.insert("abc", "B", kT0);
  tree.remove_tenant("A");
  EXPECT_EQ(matched(tree, "abcdef", "A"), 0u);
  EXPECT_EQ(matched(tree, "abcdef", "B"), 3u);
  EXPECT_EQ(tree.stats().bytes, 3u);
  tree.remove_tenant("B");
  EXPECT_EQ(tree.stats().bytes, 0u);
  EXPECT_EQ(tree.stats().tree_nodes, 1u);
  tree.remove_tenant("never seen");
}

TEST(PrefixTree, TheBudgetDropsTheLeastRecentlyUsed) {
  PrefixTree tree(/*max_bytes=*/100);
  for (int i = 0; i < 20; ++i) {
    tree.insert(std::string(1, static_cast<char>('a' + i)) + "123456789", "n" + std::to_string(i), kT0 + i * 1s);
    EXPECT_LE(tree.stats().bytes, 100u);
  }
  EXPECT_GT(tree.stats().evictions, 0u);
  EXPECT_EQ(matched(tree, "a123456789", "n0"), 0u);    // the oldest went
  EXPECT_EQ(matched(tree, "t123456789", "n19"), 10u);  // the newest stayed
  // Using an old entry again keeps it.
  tree.insert("s123456789", "n18", kT0 + 100s);
  for (int i = 0; i < 5; ++i) tree.insert("X" + std::to_string(i) + "12345678", "m", kT0 + (101 + i) * 1s);
  EXPECT_EQ(matched(tree, "s123456789", "n18"), 10u);
}

TEST(PrefixTree, PromptsAreCutAtMaxPromptBytes) {
  PrefixTree tree(1 << 20, /*max_prompt_bytes=*/8);
  tree.insert("0123456789abcdef", "A", kT0);
  EXPECT_EQ(tree.stats().bytes, 8u);
  EXPECT_EQ(matched(tree, "0123456789abcdef", "A"), 8u);
}

TEST(PrefixTree, ADeepChainIsRemovedAndDestroyedWithoutRecursion) {
  auto tree = std::make_unique<PrefixTree>(1 << 20, 20000);
  std::string prompt;
  for (int i = 0; i < 20000; ++i) {
    prompt += 'a';
    if (i % 4 == 0 || i > 19990) tree->insert(prompt, "A", kT0);
  }
  EXPECT_EQ(matched(*tree, prompt, "A"), 20000u);
  EXPECT_GT(tree->stats().tree_nodes, 5000u);
  tree->insert(prompt.substr(0, 10), "B", kT0);
  tree->remove_tenant("A");
  EXPECT_EQ(tree->stats().bytes, 10u);
  tree->insert(prompt, "A", kT0);
  for (int i = 0; i < 20000; i += 3) tree->insert(prompt.substr(0, i + 1), "C", kT0);
  tree.reset();  // no stack overflow
}

}  // namespace
}  // namespace pdr::router::cache
