#include "transfer/core/coalesce.h"

#include <string>

namespace pdr::transfer {

namespace {

struct LayerRange {
  std::uint32_t first = 0;
  std::uint32_t count = 0;
};

bool layer_range(const BlockLayout& layout, const CoalesceOptions& options, LayerRange* range) {
  if (options.first_layer >= layout.layers) return false;
  const std::uint32_t available = layout.layers - options.first_layer;
  const std::uint32_t count = options.layer_count == 0 ? available : options.layer_count;
  if (count > available) return false;
  *range = {options.first_layer, count};
  return true;
}

Status too_small(std::size_t capacity) {
  return Status(StatusCode::kTooLarge,
                "segment buffer of " + std::to_string(capacity) + " entries is too small");
}

}  // namespace

std::size_t coalesce_max_segments(std::size_t pairs, const BlockLayout& local,
                                  const CoalesceOptions& options) {
  LayerRange range;
  if (!layer_range(local, options, &range)) return 0;
  std::uint64_t pieces_per_block = 1;
  if (options.max_segment_bytes != 0 && local.block_bytes != 0) {
    // A run of k blocks becomes ceil(k*bb/max) <= k*ceil(bb/max) pieces.
    pieces_per_block = local.block_bytes / options.max_segment_bytes +
                       (local.block_bytes % options.max_segment_bytes != 0);
  }
  std::size_t total = 0;
  if (__builtin_mul_overflow(pairs, static_cast<std::size_t>(range.count), &total) ||
      __builtin_mul_overflow(total, static_cast<std::size_t>(pieces_per_block), &total)) {
    return 0;
  }
  return total;
}

Status coalesce(const BlockLayout& local, std::span<const std::uint32_t> local_ids,
                const BlockLayout& remote, std::span<const std::uint32_t> remote_ids,
                std::span<Segment> out, std::size_t* count, const CoalesceOptions& options) {
  *count = 0;
  if (local_ids.size() != remote_ids.size()) {
    return Status(StatusCode::kInvalidValue,
                  std::to_string(local_ids.size()) + " local block ids but " +
                      std::to_string(remote_ids.size()) + " remote block ids");
  }
  if (local.block_bytes != remote.block_bytes) {
    return Status(StatusCode::kInvalidValue, "block_bytes differ: local " +
                                                 std::to_string(local.block_bytes) + ", remote " +
                                                 std::to_string(remote.block_bytes));
  }
  if (local.layers != remote.layers) {
    return Status(StatusCode::kInvalidValue, "layers differ: local " +
                                                 std::to_string(local.layers) + ", remote " +
                                                 std::to_string(remote.layers));
  }
  LayerRange layers;
  if (!layer_range(local, options, &layers)) {
    return Status(StatusCode::kInvalidValue, "layer range is empty or beyond the layout's " +
                                                 std::to_string(local.layers) + " layers");
  }
  // Validate every id before producing anything, so a failure never leaves a partial plan.
  for (std::size_t i = 0; i < local_ids.size(); ++i) {
    if (local_ids[i] >= local.block_count) {
      return Status(StatusCode::kOutOfRange, "local block id [" + std::to_string(i) + "] = " +
                                                 std::to_string(local_ids[i]) + " >= block_count " +
                                                 std::to_string(local.block_count));
    }
    if (remote_ids[i] >= remote.block_count) {
      return Status(StatusCode::kOutOfRange, "remote block id [" + std::to_string(i) + "] = " +
                                                 std::to_string(remote_ids[i]) +
                                                 " >= block_count " +
                                                 std::to_string(remote.block_count));
    }
  }

  const std::uint64_t max = options.max_segment_bytes;
  std::size_t n = 0;
  // The open segment is out[n-1] while `open` is true. It may be extended up to `max`.
  bool open = false;
  for (std::uint32_t layer = layers.first; layer < layers.first + layers.count; ++layer) {
    for (std::size_t i = 0; i < local_ids.size(); ++i) {
      const BlockSpan l = block_span(local, local_ids[i], layer);
      const BlockSpan r = block_span(remote, remote_ids[i], layer);
      std::uint64_t local_at = l.offset;
      std::uint64_t remote_at = r.offset;
      std::uint64_t left = l.length;
      if (open) {
        Segment& last = out[n - 1];
        if (last.local_offset + last.length == local_at &&
            last.remote_offset + last.length == remote_at) {
          const std::uint64_t room = max == 0 ? left : max - last.length;
          const std::uint64_t take = left < room ? left : room;
          last.length += take;
          local_at += take;
          remote_at += take;
          left -= take;
        }
      }
      while (left > 0) {
        if (n == out.size()) return too_small(out.size());
        const std::uint64_t take = (max == 0 || left < max) ? left : max;
        out[n++] = {local_at, remote_at, take};
        local_at += take;
        remote_at += take;
        left -= take;
      }
      open = true;
    }
  }
  *count = n;
  return Status::ok();
}

}  // namespace pdr::transfer
