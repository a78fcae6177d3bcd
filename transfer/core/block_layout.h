// BlockLayout: how a KV pool is cut into blocks inside one registered region.
//
// Block b of layer l occupies
//   [base_offset + l * layer_stride + b * stride, ... + block_bytes)
// inside `region`. This covers both common KV shapes: layer-major pools (layer_stride = one
// layer's whole pool, stride = block_bytes) and block-major pools where a block holds every layer
// (stride = layers * block_bytes, layer_stride = block_bytes). A layout is defined once and reused
// for every transfer (docs/design/kv-transfer.md, Engine API, "Block layouts").
//
// Pure functions, no state, no threads.
#pragma once

#include <cstdint>

#include "proto/base/status.h"
#include "transfer/core/region_table.h"

namespace pdr::transfer {

struct BlockLayout {
  RegionId region = kInvalidRegion;
  std::uint64_t base_offset = 0;   // first byte of block 0, layer 0, from the region start
  std::uint64_t block_bytes = 0;   // bytes of one block of one layer (> 0)
  std::uint64_t stride = 0;        // distance between consecutive blocks of a layer
  std::uint32_t block_count = 0;   // blocks per layer (> 0)
  std::uint32_t layers = 1;        // >= 1
  std::uint64_t layer_stride = 0;  // distance between layer l and l+1 of the same block
};

struct BlockSpan {
  std::uint64_t offset = 0;  // from the region start
  std::uint64_t length = 0;
};

// Checks the layout's own shape and that its furthest byte fits a region of `region_length` bytes,
// with overflow-checked arithmetic:
//   block_bytes > 0, block_count > 0, layers > 0;
//   stride >= block_bytes when block_count > 1 (blocks of one layer never overlap);
//   layer_stride > 0 when layers > 1;
//   base_offset + (layers-1)*layer_stride + (block_count-1)*stride + block_bytes <= region_length.
// Blocks of different layers may interleave (block-major pools) and are not checked for overlap.
// kInvalidValue for a bad shape, kOutOfRange when it does not fit.
Status validate_layout(const BlockLayout& layout, std::uint64_t region_length);

// The same against the live region table (kNotFound for an unregistered region).
Status validate_layout(const BlockLayout& layout, const RegionTable& regions);

// Span of (block, layer). Precondition: the layout validated, block < block_count and
// layer < layers; then the arithmetic cannot overflow. Callers with untrusted ids check them first
// (coalesce() does).
inline BlockSpan block_span(const BlockLayout& layout, std::uint32_t block, std::uint32_t layer) {
  return {layout.base_offset + layer * layout.layer_stride + block * layout.stride,
          layout.block_bytes};
}

}  // namespace pdr::transfer
