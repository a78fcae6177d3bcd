#include "router/cache/prefix_tree.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <random>
#include <string>

// Every allocation of this test program is counted (the bytes asked for, without the allocator's
// own overhead), so the tree's charge can be compared with what it really allocates.
namespace {
std::atomic<int64_t> g_live_bytes{0};
constexpr size_t kHeader = 16;  // keeps the default new alignment

void* counted_alloc(std::size_t n) {
  void* base = std::malloc(n + kHeader);
  if (base == nullptr) return nullptr;
  *static_cast<std::size_t*>(base) = n;
  g_live_bytes.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  return static_cast<char*>(base) + kHeader;
}

void counted_free(void* p) noexcept {
  if (p == nullptr) return;
  char* base = static_cast<char*>(p) - kHeader;
  g_live_bytes.fetch_sub(static_cast<int64_t>(*reinterpret_cast<std::size_t*>(base)), std::memory_order_relaxed);
  std::free(base);
}
}  // namespace

void* operator new(std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted_alloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n); }
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, std::size_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::size_t) noexcept { counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }

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

// "x" + 5 base-62 digits: prompts that share short prefixes, so each adds one or two tree nodes
// with a byte or two of text (the shape that costs the most per byte of prompt).
std::string trie_prompt(uint64_t n) {
  static constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string out = "x";
  for (int i = 0; i < 5; ++i, n /= 62) out += kDigits[n % 62];
  return out;
}

// Distinct pseudo-random numbers below 62^5.
struct TrieSource {
  std::mt19937_64 rng{42};
  std::string next() { return trie_prompt(rng() % 916132832); }
};

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
  EXPECT_EQ(tree.stats().tree_nodes, 3u);  // root, "abc", "def"
}

TEST(PrefixTree, RemovingATenantDropsWhatOnlyItHeld) {
  PrefixTree tree;
  const size_t empty = tree.stats().bytes;
  tree.insert("abcdef", "A", kT0);
  tree.insert("abc", "B", kT0);
  tree.remove_tenant("A");
  EXPECT_EQ(matched(tree, "abcdef", "A"), 0u);
  EXPECT_EQ(matched(tree, "abcdef", "B"), 3u);
  tree.insert("zzz", "B", kT0);  // sweeps the retired marks
  EXPECT_EQ(tree.stats().tree_nodes, 3u);  // root, "abc", "zzz"
  EXPECT_EQ(tree.stats().tenants, 1u);
  tree.remove_tenant("B");
  tree.insert("q", "C", kT0);  // sweeps B's marks and the nodes only B held
  EXPECT_TRUE(tree.match("abcdef").empty());
  EXPECT_EQ(tree.stats().tree_nodes, 2u);  // root and "q"
  EXPECT_EQ(tree.stats().tenants, 1u);
  tree.remove_tenant("never seen");
  tree.remove_tenant("C");
  tree.insert("q", "D", kT0);  // C's mark is replaced in passing
  EXPECT_EQ(tree.stats().tree_nodes, 2u);
  EXPECT_EQ(tree.stats().tenants, 1u);
  EXPECT_GT(tree.stats().bytes, empty);
}

TEST(PrefixTree, TheBudgetDropsTheLeastRecentlyUsed) {
  // What one 10-byte prompt of its own tenant costs, measured on a tree without a budget.
  size_t per_prompt;
  {
    PrefixTree probe;
    const size_t empty = probe.stats().bytes;
    probe.insert("a123456789", "n0", kT0);
    probe.insert("b123456789", "n1", kT0);
    per_prompt = (probe.stats().bytes - empty) / 2;
  }
  PrefixTree sized(1 << 20);
  const size_t budget = sized.stats().bytes + per_prompt * 10;  // ten of them
  PrefixTree tree(budget);
  for (int i = 0; i < 20; ++i) {
    tree.insert(std::string(1, static_cast<char>('a' + i)) + "123456789", "n" + std::to_string(i), kT0 + i * 1s);
    EXPECT_LE(tree.stats().bytes, budget);
  }
  EXPECT_GT(tree.stats().evictions, 0u);
  EXPECT_EQ(matched(tree, "a123456789", "n0"), 0u);    // the oldest went
  EXPECT_EQ(matched(tree, "t123456789", "n19"), 10u);  // the newest stayed
  // Using an old entry again keeps it.
  const std::string kept = "s123456789";
  ASSERT_EQ(matched(tree, kept, "n18"), 10u);
  tree.insert(kept, "n18", kT0 + 100s);
  for (int i = 0; i < 5; ++i) tree.insert("X" + std::to_string(i) + "12345678", "m", kT0 + (101 + i) * 1s);
  EXPECT_EQ(matched(tree, kept, "n18"), 10u);
}

TEST(PrefixTree, PromptsAreCutAtMaxPromptBytes) {
  PrefixTree tree(1 << 20, /*max_prompt_bytes=*/8);
  tree.insert("0123456789abcdef", "A", kT0);
  EXPECT_EQ(matched(tree, "0123456789abcdef", "A"), 8u);
  EXPECT_EQ(tree.stats().tree_nodes, 2u);
}

TEST(PrefixTree, ADeepChainIsRemovedAndDestroyedWithoutRecursion) {
  auto tree = std::make_unique<PrefixTree>(64 << 20, 20000);
  std::string prompt;
  for (int i = 0; i < 20000; ++i) {
    prompt += 'a';
    if (i % 4 == 0 || i > 19990) tree->insert(prompt, "A", kT0);
  }
  EXPECT_EQ(matched(*tree, prompt, "A"), 20000u);
  EXPECT_GT(tree->stats().tree_nodes, 5000u);
  tree->insert(prompt.substr(0, 10), "B", kT0);
  tree->remove_tenant("A");
  for (int i = 0; i < 2000 && tree->stats().tree_nodes > 2; ++i) tree->insert(prompt.substr(0, 10), "B", kT0);
  EXPECT_EQ(tree->stats().tree_nodes, 2u);  // root and B's "aaaaaaaaaa"
  tree->insert(prompt, "A", kT0);
  for (int i = 0; i < 20000; i += 6) tree->insert(prompt.substr(0, i + 1), "C", kT0);
  tree.reset();  // no stack overflow
}

// The budget is the tree's real memory: what it charges stays within 1.5x of what it allocates
// (the charge includes the allocator's rounding, so it is the larger of the two), for the
// trie-shaped prompts that cost the most per byte of text, for long prompts, and after evictions
// and tenant removals.
TEST(PrefixTree, TheChargeIsTheMemoryTheTreeAllocates) {
  auto check = [](const char* what, int64_t live_before, const PrefixTree& tree) {
    const auto allocated = static_cast<double>(g_live_bytes.load() - live_before);
    const auto charged = static_cast<double>(tree.stats().bytes);
    EXPECT_GE(charged, allocated) << what;
    EXPECT_LE(charged, 1.5 * allocated) << what;
  };
  {
    const int64_t before = g_live_bytes.load();
    auto tree = std::make_unique<PrefixTree>(64 << 20);
    TrieSource prompts;
    for (int i = 0; i < 50000; ++i) {
      const std::string p = prompts.next();
      tree->insert(p, "127.0.0.1:8100", kT0 + i * 1ms);
      tree->insert(p, "127.0.0.1:8200", kT0 + i * 1ms);
    }
    EXPECT_GT(tree->stats().tree_nodes, 50000u);
    check("trie-shaped", before, *tree);
    // About 180 bytes per node, as the header says.
    const double per_node = static_cast<double>(tree->stats().bytes) / static_cast<double>(tree->stats().tree_nodes);
    EXPECT_GT(per_node, 140.0);
    EXPECT_LT(per_node, 230.0);
    tree.reset();
    EXPECT_EQ(g_live_bytes.load(), before);
  }
  {
    const int64_t before = g_live_bytes.load();
    PrefixTree tree(256 << 10);
    std::mt19937_64 rng(7);
    for (int i = 0; i < 3000; ++i) {
      std::string p = "You are assistant " + std::to_string(rng() % 50) + ". ";
      p.append(100 + rng() % 400, static_cast<char>('a' + rng() % 26));
      tree.insert(p, "127.0.0.1:" + std::to_string(8000 + rng() % 20), kT0 + i * 1ms);
    }
    EXPECT_GT(tree.stats().evicted_nodes, 0u);
    EXPECT_LE(tree.stats().bytes, size_t{256} << 10);
    check("long prompts, evicting", before, tree);
    for (int n = 0; n < 10; ++n) tree.remove_tenant("127.0.0.1:" + std::to_string(8000 + n));
    for (int i = 0; i < 3000; ++i) tree.insert(trie_prompt(static_cast<uint64_t>(i) * 7919), "127.0.0.1:8019", kT0 + 1h);
    check("after removals", before, tree);
  }
}

// Eviction takes leaves off the oldest end of a list: the nodes it visits are the nodes it drops
// (and the parents it merges), however large the tree, never a walk of the whole tree.
TEST(PrefixTree, EvictionVisitsOnlyWhatItDrops) {
  PrefixTree tree(8 << 20);
  TrieSource prompts;
  int i = 0;
  while (tree.stats().evicted_nodes == 0) {
    tree.insert(prompts.next(), "127.0.0.1:8100", kT0 + i++ * 1ms);
    ASSERT_LT(i, 1'000'000);
  }
  const PrefixTree::Stats full = tree.stats();
  EXPECT_GT(full.tree_nodes, 30000u);
  // Each later eviction pass drops about a tenth of the budget; inserts between passes visit
  // nothing.
  uint64_t passes = 0;
  uint64_t evicted = full.evicted_nodes;
  uint64_t visits = full.maintenance_visits;
  for (; passes < 3; ++i) {
    tree.insert(prompts.next(), "127.0.0.1:8100", kT0 + i * 1ms);
    const PrefixTree::Stats now = tree.stats();
    if (now.evicted_nodes == evicted) {
      EXPECT_EQ(now.maintenance_visits, visits);
    } else {
      ++passes;
      evicted = now.evicted_nodes;
    }
    visits = now.maintenance_visits;
  }
  const PrefixTree::Stats after = tree.stats();
  const uint64_t dropped = after.evicted_nodes - full.evicted_nodes;
  const uint64_t visited = after.maintenance_visits - full.maintenance_visits;
  EXPECT_GT(dropped, 1000u);
  EXPECT_GE(visited, dropped);
  EXPECT_LE(visited, 2 * dropped);  // a visit per node dropped, at most one more per merge
  EXPECT_LE(after.bytes, size_t{8} << 20);
  EXPECT_GT(after.tree_nodes, 30000u);  // still full: only the oldest went
}

// remove_tenant walks nothing; matches ignore the tenant at once; the following inserts clean its
// marks and nodes up a few at a time, and its table slot goes with its last mark.
TEST(PrefixTree, ATenantIsDroppedLazily) {
  PrefixTree tree(64 << 20);
  const size_t empty = tree.stats().bytes;
  for (int i = 0; i < 20000; ++i) {
    tree.insert("A" + trie_prompt(static_cast<uint64_t>(i) * 104729), "127.0.0.1:1", kT0 + i * 1ms);
    tree.insert("B" + trie_prompt(static_cast<uint64_t>(i) * 104729), "127.0.0.1:2", kT0 + i * 1ms);
  }
  tree.insert("shared system prompt", "127.0.0.1:1", kT0 + 1h);
  tree.insert("shared system prompt", "127.0.0.1:2", kT0 + 1h);
  const PrefixTree::Stats before = tree.stats();
  EXPECT_EQ(before.tenants, 2u);

  tree.remove_tenant("127.0.0.1:1");
  const PrefixTree::Stats removed = tree.stats();
  EXPECT_EQ(removed.maintenance_visits, before.maintenance_visits);  // no walk
  EXPECT_EQ(removed.tree_nodes, before.tree_nodes);                  // nothing freed yet
  EXPECT_EQ(matched(tree, "A" + trie_prompt(0), "127.0.0.1:1"), 0u);
  const auto shared = tree.match("shared system prompt");
  ASSERT_EQ(shared.size(), 1u);
  EXPECT_EQ(shared[0].tenant, "127.0.0.1:2");

  // The same key coming back (a restart) starts afresh: its old marks do not count.
  tree.insert("A-new", "127.0.0.1:1", kT0 + 2h);
  EXPECT_EQ(matched(tree, "A-new", "127.0.0.1:1"), 5u);
  EXPECT_EQ(matched(tree, "A" + trie_prompt(0), "127.0.0.1:1"), 1u);  // "A" of "A-new" only

  // Each insert visits at most its own path plus a few nodes; about 20,000 nodes of A go.
  uint64_t visits = tree.stats().maintenance_visits;
  int inserts = 0;
  while (tree.stats().tenants > 2 || tree.stats().tree_nodes > before.tree_nodes / 2 + 100) {
    tree.insert("B" + trie_prompt(static_cast<uint64_t>(inserts % 20000) * 104729), "127.0.0.1:2", kT0 + 3h);
    const uint64_t now = tree.stats().maintenance_visits;
    EXPECT_LE(now - visits, 2u * (7u + 16u));  // path (7 bytes) + sweep steps, and a merge each
    visits = now;
    ASSERT_LT(++inserts, 20000) << "the sweep never finished";
  }
  EXPECT_EQ(tree.stats().tenants, 2u);  // 127.0.0.1:2 and the returned 127.0.0.1:1
  EXPECT_LT(tree.stats().bytes - empty, (before.bytes - empty) * 6 / 10);
  EXPECT_EQ(matched(tree, "B" + trie_prompt(0), "127.0.0.1:2"), 7u);
  EXPECT_EQ(matched(tree, "A-new", "127.0.0.1:1"), 5u);
}

// Nodes that stop getting traffic (never removed) leave the tenant table with their last mark.
TEST(PrefixTree, TheTenantTableHoldsOnlyTenantsWithMarks) {
  PrefixTree sized;
  PrefixTree tree(sized.stats().bytes + 64 * 1024);
  for (int i = 0; i < 20000; ++i) {
    tree.insert(trie_prompt(static_cast<uint64_t>(i) * 7919), "127.0.0.1:" + std::to_string(10000 + i), kT0 + i * 1ms);
  }
  const PrefixTree::Stats st = tree.stats();
  EXPECT_LT(st.tenants, 2000u);
  EXPECT_LE(st.bytes, sized.stats().bytes + 64 * 1024);
}

}  // namespace
}  // namespace pdr::router::cache
