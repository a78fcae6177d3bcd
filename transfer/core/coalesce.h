// Coalescing: turn a block-id transfer into the fewest contiguous byte segments.
//
// transfer(op, peer, local_layout, local_ids[], remote_layout, remote_ids[]) moves block
// local_ids[i] <-> remote_ids[i] for every layer in the chosen layer range. coalesce() expands that
// into {local_offset, remote_offset, length} segments, walking layer by layer and, within a layer,
// the id pairs in the order given. A block extends the previous segment when it is contiguous with
// it on BOTH sides (its local and remote offsets are exactly where the segment ends), e.g.
// consecutive ids on both sides with stride == block_bytes; this also joins the last block of one
// layer to the first of the next when the layouts happen to make them adjacent. The output is thus
// the minimal segment list for that order. With max_segment_bytes set, every maximal contiguous run
// is then cut into max_segment_bytes pieces plus a shorter tail (lane striping, docs/design/kv-transfer.md T-6).
//
// Duplicates are not detected (that would need memory proportional to the pool): a repeated id
// is never contiguous with itself, so each occurrence gets its own segment and its bytes move once
// per occurrence. Repeated *destination* ids make the final contents depend on the order in which a
// backend lands segments; the engine rejects them before calling this if it cares.
//
// Hot path: no allocation, no locks; output goes to a caller-provided buffer. Size it with
// coalesce_max_segments(). Pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "proto/base/status.h"
#include "transfer/core/block_layout.h"

namespace pdr::transfer {

struct Segment {
  std::uint64_t local_offset = 0;   // from the start of the local layout's region
  std::uint64_t remote_offset = 0;  // from the start of the remote layout's region
  std::uint64_t length = 0;
  bool operator==(const Segment&) const = default;
};

struct CoalesceOptions {
  std::uint64_t max_segment_bytes = 0;  // 0: no limit
  std::uint32_t first_layer = 0;        // layer range [first_layer, first_layer + layer_count)
  std::uint32_t layer_count = 0;        // 0: every layer from first_layer on
};

// Upper bound on the segments coalesce() can produce for `pairs` id pairs (for sizing `out`).
// Returns 0 on arithmetic overflow.
std::size_t coalesce_max_segments(std::size_t pairs, const BlockLayout& local,
                                  const CoalesceOptions& options = {});

// Both layouts must already be validated (validate_layout). Errors, with *count left at 0:
//   kInvalidValue: local_ids.size() != remote_ids.size(); block_bytes or layers differ between the
//                  layouts; an empty or out-of-range layer range;
//   kOutOfRange:   an id >= its layout's block_count (the message names the index);
//   kTooLarge:     `out` is too small (coalesce_max_segments() is always enough).
// Zero pairs succeed with *count = 0.
Status coalesce(const BlockLayout& local, std::span<const std::uint32_t> local_ids,
                const BlockLayout& remote, std::span<const std::uint32_t> remote_ids,
                std::span<Segment> out, std::size_t* count, const CoalesceOptions& options = {});

}  // namespace pdr::transfer
