#include "transfer/core/block_layout.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace pdr::transfer {
namespace {

BlockLayout layer_major(std::uint64_t block_bytes, std::uint32_t blocks, std::uint32_t layers) {
  return {.region = 1,
          .base_offset = 0,
          .block_bytes = block_bytes,
          .stride = block_bytes,
          .block_count = blocks,
          .layers = layers,
          .layer_stride = block_bytes * blocks};
}

TEST(BlockLayout, ValidLayoutsFitExactly) {
  EXPECT_TRUE(validate_layout(layer_major(256, 10, 4), 256 * 10 * 4).is_ok());
  EXPECT_EQ(validate_layout(layer_major(256, 10, 4), 256 * 10 * 4 - 1).code(),
            StatusCode::kOutOfRange);
  BlockLayout offset = layer_major(256, 10, 1);
  offset.base_offset = 100;
  EXPECT_TRUE(validate_layout(offset, 2660).is_ok());
  EXPECT_EQ(validate_layout(offset, 2659).code(), StatusCode::kOutOfRange);
  // Padding between blocks: the last block ends at 9*300+256.
  BlockLayout padded = layer_major(256, 10, 1);
  padded.stride = 300;
  EXPECT_TRUE(validate_layout(padded, 9 * 300 + 256).is_ok());
  EXPECT_EQ(validate_layout(padded, 9 * 300 + 255).code(), StatusCode::kOutOfRange);
}

TEST(BlockLayout, BlockMajorInterleavingIsValid) {
  // Each block holds all 4 layers back to back.
  BlockLayout l{.region = 1, .base_offset = 0, .block_bytes = 64, .stride = 256,
                .block_count = 8, .layers = 4, .layer_stride = 64};
  EXPECT_TRUE(validate_layout(l, 8 * 256).is_ok());
  EXPECT_EQ(block_span(l, 2, 3).offset, 2u * 256 + 3 * 64);
  EXPECT_EQ(block_span(l, 2, 3).length, 64u);
}

TEST(BlockLayout, RejectsBadShapes) {
  BlockLayout l = layer_major(256, 10, 2);
  l.block_bytes = 0;
  EXPECT_EQ(validate_layout(l, 1 << 20).code(), StatusCode::kInvalidValue);
  l = layer_major(256, 10, 2);
  l.block_count = 0;
  EXPECT_EQ(validate_layout(l, 1 << 20).code(), StatusCode::kInvalidValue);
  l = layer_major(256, 10, 2);
  l.layers = 0;
  EXPECT_EQ(validate_layout(l, 1 << 20).code(), StatusCode::kInvalidValue);
  l = layer_major(256, 10, 2);
  l.stride = 255;  // overlapping blocks
  EXPECT_EQ(validate_layout(l, 1 << 20).code(), StatusCode::kInvalidValue);
  l = layer_major(256, 1, 1);
  l.stride = 0;  // one block: stride is irrelevant
  EXPECT_TRUE(validate_layout(l, 256).is_ok());
  l = layer_major(256, 10, 2);
  l.layer_stride = 0;
  EXPECT_EQ(validate_layout(l, 1 << 20).code(), StatusCode::kInvalidValue);
}

TEST(BlockLayout, OverflowingExtentIsRejected) {
  BlockLayout l = layer_major(1, 2, 1);
  l.base_offset = UINT64_MAX;
  EXPECT_EQ(validate_layout(l, UINT64_MAX).code(), StatusCode::kOutOfRange);
  l = layer_major(1, 3, 1);
  l.stride = UINT64_MAX / 2 + 1;  // 2 * stride wraps to 0
  EXPECT_EQ(validate_layout(l, UINT64_MAX).code(), StatusCode::kOutOfRange);
  l = layer_major(8, 4, 3);
  l.layer_stride = UINT64_MAX / 2 + 1;
  EXPECT_EQ(validate_layout(l, UINT64_MAX).code(), StatusCode::kOutOfRange);
  l = layer_major(UINT64_MAX, 1, 1);
  l.base_offset = 1;
  EXPECT_EQ(validate_layout(l, UINT64_MAX).code(), StatusCode::kOutOfRange);
}

TEST(BlockLayout, ValidatesAgainstTheRegionTable) {
  std::vector<std::byte> pool(256 * 10 * 2);
  RegionTable table;
  RegionId id = kInvalidRegion;
  ASSERT_TRUE(table.register_region(pool.data(), pool.size(), MemKind::kHostDram, &id).is_ok());
  BlockLayout l = layer_major(256, 10, 2);
  l.region = id;
  EXPECT_TRUE(validate_layout(l, table).is_ok());
  l.block_count = 11;
  EXPECT_EQ(validate_layout(l, table).code(), StatusCode::kOutOfRange);
  l.region = id + 1;
  EXPECT_EQ(validate_layout(l, table).code(), StatusCode::kNotFound);
}

TEST(BlockLayout, SpansOfEveryBlockResolve) {
  std::vector<std::byte> pool(64 + 9 * 80 + 50 + 2 * 1000);
  RegionTable table;
  RegionId id = kInvalidRegion;
  ASSERT_TRUE(table.register_region(pool.data(), pool.size(), MemKind::kHostDram, &id).is_ok());
  BlockLayout l{.region = id, .base_offset = 64, .block_bytes = 50, .stride = 80,
                .block_count = 10, .layers = 3, .layer_stride = 1000};
  ASSERT_TRUE(validate_layout(l, table).is_ok());
  for (std::uint32_t layer = 0; layer < l.layers; ++layer) {
    for (std::uint32_t b = 0; b < l.block_count; ++b) {
      BlockSpan span = block_span(l, b, layer);
      EXPECT_EQ(span.offset, 64u + layer * 1000u + b * 80u);
      std::byte* p = nullptr;
      EXPECT_TRUE(table.resolve(id, span.offset, span.length, &p).is_ok());
    }
  }
}

}  // namespace
}  // namespace pdr::transfer
