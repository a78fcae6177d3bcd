#include "node/sim/kv_content.h"

#include <gtest/gtest.h>

#include <vector>

namespace pdr::node::sim {
namespace {

std::vector<std::byte> block_of(uint64_t seed, uint32_t block, uint32_t layer, size_t size) {
  std::vector<std::byte> out(size);
  fill_kv_block(seed, block, layer, out);
  return out;
}

TEST(KvContent, DeterministicAndChecked) {
  const uint64_t seed = kv_content_seed("tx-1", "the prompt");
  EXPECT_EQ(seed, kv_content_seed("tx-1", "the prompt"));
  const auto a = block_of(seed, 3, 1, 4096);
  EXPECT_EQ(a, block_of(seed, 3, 1, 4096));
  EXPECT_FALSE(check_kv_block(seed, 3, 1, a).has_value());
}

TEST(KvContent, DiffersPerKeyPromptBlockAndLayer) {
  const uint64_t seed = kv_content_seed("tx-1", "the prompt");
  EXPECT_NE(seed, kv_content_seed("tx-2", "the prompt"));
  EXPECT_NE(seed, kv_content_seed("tx-1", "the prompt!"));
  EXPECT_NE(kv_content_seed("ab", "c"), kv_content_seed("a", "bc"));
  const auto a = block_of(seed, 0, 0, 256);
  EXPECT_NE(a, block_of(seed, 1, 0, 256));
  EXPECT_NE(a, block_of(seed, 0, 1, 256));
  // Another request's bytes fail the check at once.
  const uint64_t other = kv_content_seed("tx-2", "the prompt");
  EXPECT_EQ(check_kv_block(other, 0, 0, a), std::optional<size_t>(0));
}

TEST(KvContent, ReportsTheFirstDifferingByte) {
  const uint64_t seed = kv_content_seed("k", "p");
  auto a = block_of(seed, 7, 0, 1000);  // not a multiple of 8
  a[997] ^= std::byte{1};
  EXPECT_EQ(check_kv_block(seed, 7, 0, a), std::optional<size_t>(997));
  a[997] ^= std::byte{1};
  a[5] ^= std::byte{0x80};
  EXPECT_EQ(check_kv_block(seed, 7, 0, a), std::optional<size_t>(5));
}

// The bytes are a wire contract between a prefill and a decode that may run different builds:
// pinned here (the word-at-a-time fill must produce what the byte-by-byte one did).
TEST(KvContent, BytesArePinned) {
  const auto got = block_of(kv_content_seed("tx-1", "the prompt"), 3, 1, 13);
  const std::vector<unsigned char> want{0x02, 0x7f, 0x0b, 0xd5, 0x87, 0xce, 0x87,
                                        0xd9, 0x0d, 0x11, 0xd5, 0x4a, 0x8b};
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], std::byte{want[i]}) << i;
}

TEST(KvContent, ShorterBlocksArePrefixes) {
  const uint64_t seed = kv_content_seed("k", "p");
  const auto big = block_of(seed, 2, 0, 64);
  const auto small = block_of(seed, 2, 0, 13);
  EXPECT_TRUE(std::equal(small.begin(), small.end(), big.begin()));
}

}  // namespace
}  // namespace pdr::node::sim
