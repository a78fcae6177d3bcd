#include "transfer/core/coalesce.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace pdr::transfer {
namespace {

BlockLayout contiguous(std::uint64_t block_bytes, std::uint32_t blocks, std::uint32_t layers,
                       std::uint64_t base = 0) {
  return {.region = 1,
          .base_offset = base,
          .block_bytes = block_bytes,
          .stride = block_bytes,
          .block_count = blocks,
          .layers = layers,
          .layer_stride = block_bytes * blocks};
}

std::vector<Segment> run(const BlockLayout& local, const std::vector<std::uint32_t>& lids,
                         const BlockLayout& remote, const std::vector<std::uint32_t>& rids,
                         const CoalesceOptions& options = {}, Status* status_out = nullptr) {
  std::vector<Segment> out(coalesce_max_segments(lids.size(), local, options));
  std::size_t n = 0;
  Status status = coalesce(local, lids, remote, rids, out, &n, options);
  if (status_out != nullptr) {
    *status_out = status;
  } else {
    EXPECT_TRUE(status.is_ok()) << status.to_string();
  }
  out.resize(n);
  return out;
}

// The reference: one span per (layer, pair) in order, then merge runs that are adjacent on both
// sides, then cut every merged run into max-sized pieces. A different algorithm from coalesce()'s
// single greedy pass, same contract.
std::vector<Segment> reference(const BlockLayout& local, const std::vector<std::uint32_t>& lids,
                               const BlockLayout& remote, const std::vector<std::uint32_t>& rids,
                               const CoalesceOptions& options) {
  const std::uint32_t last =
      options.layer_count == 0 ? local.layers : options.first_layer + options.layer_count;
  std::vector<Segment> spans;
  for (std::uint32_t layer = options.first_layer; layer < last; ++layer) {
    for (std::size_t i = 0; i < lids.size(); ++i) {
      spans.push_back({local.base_offset + layer * local.layer_stride + lids[i] * local.stride,
                       remote.base_offset + layer * remote.layer_stride + rids[i] * remote.stride,
                       local.block_bytes});
    }
  }
  std::vector<Segment> runs;
  for (const Segment& s : spans) {
    if (!runs.empty() && runs.back().local_offset + runs.back().length == s.local_offset &&
        runs.back().remote_offset + runs.back().length == s.remote_offset) {
      runs.back().length += s.length;
    } else {
      runs.push_back(s);
    }
  }
  if (options.max_segment_bytes == 0) return runs;
  std::vector<Segment> pieces;
  for (const Segment& r : runs) {
    for (std::uint64_t at = 0; at < r.length; at += options.max_segment_bytes) {
      const std::uint64_t len = std::min(options.max_segment_bytes, r.length - at);
      pieces.push_back({r.local_offset + at, r.remote_offset + at, len});
    }
  }
  return pieces;
}

TEST(Coalesce, ConsecutiveIdsOnBothSidesMergeIntoOneSegment) {
  BlockLayout local = contiguous(4096, 100, 1);
  BlockLayout remote = contiguous(4096, 100, 1, 8192);
  auto segs = run(local, {10, 11, 12, 13}, remote, {50, 51, 52, 53});
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0], (Segment{10 * 4096, 8192 + 50 * 4096, 4 * 4096}));
}

TEST(Coalesce, ContiguityMustHoldOnBothSides) {
  BlockLayout local = contiguous(100, 100, 1);
  BlockLayout remote = contiguous(100, 100, 1);
  // Local consecutive, remote not: 2 segments. Then remote consecutive, local not.
  EXPECT_EQ(run(local, {1, 2}, remote, {5, 7}).size(), 2u);
  EXPECT_EQ(run(local, {1, 3}, remote, {5, 6}).size(), 2u);
  // Descending ids are not contiguous in the forward direction.
  EXPECT_EQ(run(local, {2, 1}, remote, {6, 5}).size(), 2u);
  // Two runs.
  auto segs = run(local, {1, 2, 3, 7, 8}, remote, {10, 11, 12, 20, 21});
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[0], (Segment{100, 1000, 300}));
  EXPECT_EQ(segs[1], (Segment{700, 2000, 200}));
}

TEST(Coalesce, PaddedStrideNeverMerges) {
  BlockLayout local = contiguous(100, 10, 1);
  local.stride = 128;
  BlockLayout remote = contiguous(100, 10, 1);
  EXPECT_EQ(run(local, {0, 1, 2}, remote, {0, 1, 2}).size(), 3u);
}

TEST(Coalesce, PerLayerRunsAndLayerRange) {
  // 4 layers, layer-major: the run of blocks 2..4 appears once per layer.
  BlockLayout local = contiguous(64, 16, 4);
  BlockLayout remote = contiguous(64, 32, 4);
  auto segs = run(local, {2, 3, 4}, remote, {7, 8, 9});
  ASSERT_EQ(segs.size(), 4u);
  for (std::uint32_t layer = 0; layer < 4; ++layer) {
    EXPECT_EQ(segs[layer], (Segment{layer * 16 * 64 + 2 * 64, layer * 32 * 64 + 7 * 64, 3 * 64}));
  }
  segs = run(local, {2, 3, 4}, remote, {7, 8, 9}, {.first_layer = 1, .layer_count = 2});
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[0].local_offset, 16u * 64 + 2 * 64);
  EXPECT_EQ(segs[1].local_offset, 2u * 16 * 64 + 2 * 64);
}

TEST(Coalesce, WholePoolsMergeAcrossLayers) {
  // Every block of every layer, identical contiguous layouts: one segment for the whole pool.
  BlockLayout layout = contiguous(64, 8, 3);
  std::vector<std::uint32_t> ids{0, 1, 2, 3, 4, 5, 6, 7};
  auto segs = run(layout, ids, layout, ids);
  ASSERT_EQ(segs.size(), 1u);
  EXPECT_EQ(segs[0].length, 64u * 8 * 3);
}

TEST(Coalesce, SplitsAtMaxSegment) {
  const std::uint64_t kMiB = 1 << 20;
  BlockLayout layout = contiguous(kMiB, 64, 1);
  std::vector<std::uint32_t> ids;
  for (std::uint32_t i = 0; i < 10; ++i) ids.push_back(i);
  auto segs = run(layout, ids, layout, ids, {.max_segment_bytes = 4 * kMiB});
  ASSERT_EQ(segs.size(), 3u);  // 4 + 4 + 2 MiB
  EXPECT_EQ(segs[0], (Segment{0, 0, 4 * kMiB}));
  EXPECT_EQ(segs[1], (Segment{4 * kMiB, 4 * kMiB, 4 * kMiB}));
  EXPECT_EQ(segs[2], (Segment{8 * kMiB, 8 * kMiB, 2 * kMiB}));
  // A single block larger than the maximum is split too, and pieces never straddle a boundary.
  BlockLayout big = contiguous(10 * kMiB, 4, 1);
  segs = run(big, {1}, big, {2}, {.max_segment_bytes = 4 * kMiB});
  ASSERT_EQ(segs.size(), 3u);
  EXPECT_EQ(segs[0], (Segment{10 * kMiB, 20 * kMiB, 4 * kMiB}));
  EXPECT_EQ(segs[2], (Segment{18 * kMiB, 28 * kMiB, 2 * kMiB}));
  // Block size not dividing the maximum: 3 x 3 MiB -> 4 + 4 + 1.
  BlockLayout odd = contiguous(3 * kMiB, 4, 1);
  segs = run(odd, {0, 1, 2}, odd, {0, 1, 2}, {.max_segment_bytes = 4 * kMiB});
  ASSERT_EQ(segs.size(), 3u);
  EXPECT_EQ(segs[2].length, kMiB);
}

TEST(Coalesce, DuplicatesGetTheirOwnSegments) {
  BlockLayout layout = contiguous(100, 10, 1);
  auto segs = run(layout, {3, 3, 4}, layout, {5, 6, 7});
  // 3->5 and 3->6 cannot merge (the local side repeats); 3->6 then 4->7 does.
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[0], (Segment{300, 500, 100}));
  EXPECT_EQ(segs[1], (Segment{300, 600, 200}));
}

TEST(Coalesce, Errors) {
  BlockLayout local = contiguous(100, 10, 2);
  BlockLayout remote = contiguous(100, 20, 2);
  Status status;
  std::vector<Segment> out(16);
  std::size_t n = 99;
  std::vector<std::uint32_t> one{1}, two{1, 2};
  EXPECT_EQ(coalesce(local, one, remote, two, out, &n).code(), StatusCode::kInvalidValue);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(coalesce(local, std::vector<std::uint32_t>{10}, remote, one, out, &n).code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(coalesce(local, one, remote, std::vector<std::uint32_t>{20}, out, &n).code(),
            StatusCode::kOutOfRange);
  EXPECT_TRUE(coalesce(local, one, remote, std::vector<std::uint32_t>{19}, out, &n).is_ok());
  BlockLayout other = remote;
  other.block_bytes = 200;
  EXPECT_EQ(coalesce(local, one, other, one, out, &n).code(), StatusCode::kInvalidValue);
  other = remote;
  other.layers = 3;
  EXPECT_EQ(coalesce(local, one, other, one, out, &n).code(), StatusCode::kInvalidValue);
  EXPECT_EQ(coalesce(local, one, remote, one, out, &n, {.first_layer = 2}).code(),
            StatusCode::kInvalidValue);
  EXPECT_EQ(coalesce(local, one, remote, one, out, &n, {.first_layer = 1, .layer_count = 2}).code(),
            StatusCode::kInvalidValue);
  // Too small an output buffer: 2 layers x non-contiguous pairs need 4 entries.
  std::vector<Segment> tiny(3);
  EXPECT_EQ(coalesce(local, two, remote, std::vector<std::uint32_t>{5, 9}, tiny, &n).code(),
            StatusCode::kTooLarge);
  EXPECT_EQ(n, 0u);
  // No pairs: nothing to do.
  EXPECT_TRUE(coalesce(local, {}, remote, {}, out, &n).is_ok());
  EXPECT_EQ(n, 0u);
}

TEST(Coalesce, MaxSegmentsBound) {
  BlockLayout layout = contiguous(10, 4, 3);
  EXPECT_EQ(coalesce_max_segments(5, layout), 15u);
  EXPECT_EQ(coalesce_max_segments(5, layout, {.max_segment_bytes = 4}), 45u);  // ceil(10/4)=3
  EXPECT_EQ(coalesce_max_segments(5, layout, {.first_layer = 1}), 10u);
  EXPECT_EQ(coalesce_max_segments(5, layout, {.first_layer = 3}), 0u);
  EXPECT_EQ(coalesce_max_segments(SIZE_MAX, layout), 0u);  // overflow
}

// Property test: random layouts (contiguous or padded, one or more layers), random id lists biased
// towards runs, random maxima, against the reference. Fixed seed: failures reproduce.
TEST(Coalesce, MatchesReferenceOnRandomInputs) {
  std::mt19937_64 rng(20261122);
  auto pick = [&](std::uint64_t lo, std::uint64_t hi) {
    return std::uniform_int_distribution<std::uint64_t>(lo, hi)(rng);
  };
  int merged_somewhere = 0;
  for (int iteration = 0; iteration < 3000; ++iteration) {
    const std::uint64_t block_bytes = pick(1, 64);
    const std::uint32_t layers = static_cast<std::uint32_t>(pick(1, 4));
    auto make = [&](std::uint32_t blocks) {
      BlockLayout l = contiguous(block_bytes, blocks, layers, pick(0, 3) * 7);
      if (pick(0, 3) == 0) l.stride = block_bytes + pick(1, 8);
      const bool block_major = pick(0, 3) == 0;
      if (block_major) {  // all layers of a block side by side
        l.stride = block_bytes * layers;
        l.layer_stride = block_bytes;
      } else {
        l.layer_stride = l.stride * blocks + pick(0, 1) * 16;
      }
      return l;
    };
    const BlockLayout local = make(static_cast<std::uint32_t>(pick(1, 40)));
    const BlockLayout remote = make(static_cast<std::uint32_t>(pick(1, 40)));
    ASSERT_TRUE(validate_layout(local, UINT64_MAX).is_ok());
    ASSERT_TRUE(validate_layout(remote, UINT64_MAX).is_ok());

    const std::size_t pairs = pick(0, 30);
    std::vector<std::uint32_t> lids, rids;
    for (std::size_t i = 0; i < pairs; ++i) {
      if (!lids.empty() && pick(0, 2) != 0) {  // continue a run, if it fits
        lids.push_back((lids.back() + 1) % local.block_count);
        rids.push_back((rids.back() + 1) % remote.block_count);
      } else {
        lids.push_back(static_cast<std::uint32_t>(pick(0, local.block_count - 1)));
        rids.push_back(static_cast<std::uint32_t>(pick(0, remote.block_count - 1)));
      }
    }
    CoalesceOptions options;
    if (pick(0, 1) == 1) options.max_segment_bytes = pick(1, 200);
    if (pick(0, 3) == 0) {
      options.first_layer = static_cast<std::uint32_t>(pick(0, layers - 1));
      options.layer_count = static_cast<std::uint32_t>(pick(0, layers - options.first_layer));
    }

    const std::vector<Segment> got = run(local, lids, remote, rids, options);
    const std::vector<Segment> want = reference(local, lids, remote, rids, options);
    ASSERT_EQ(got, want) << "iteration " << iteration;
    std::uint64_t total = 0;
    for (const Segment& s : got) {
      total += s.length;
      if (options.max_segment_bytes != 0) {
        ASSERT_LE(s.length, options.max_segment_bytes);
      }
    }
    const std::uint32_t layer_count =
        options.layer_count == 0 ? layers - options.first_layer : options.layer_count;
    ASSERT_EQ(total, pairs * layer_count * block_bytes);
    if (got.size() < pairs * layer_count) ++merged_somewhere;
  }
  EXPECT_GT(merged_somewhere, 300);  // the generator really exercises merging
}

}  // namespace
}  // namespace pdr::transfer
