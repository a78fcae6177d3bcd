#include "transfer/core/block_layout.h"

#include <string>

namespace pdr::transfer {

namespace {
// a * b + c into *out; false on overflow.
bool mul_add(std::uint64_t a, std::uint64_t b, std::uint64_t c, std::uint64_t* out) {
  std::uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return false;
  return !__builtin_add_overflow(product, c, out);
}
}  // namespace

Status validate_layout(const BlockLayout& layout, std::uint64_t region_length) {
  if (layout.block_bytes == 0) return Status(StatusCode::kInvalidValue, "block_bytes is 0");
  if (layout.block_count == 0) return Status(StatusCode::kInvalidValue, "block_count is 0");
  if (layout.layers == 0) return Status(StatusCode::kInvalidValue, "layers is 0");
  if (layout.block_count > 1 && layout.stride < layout.block_bytes) {
    return Status(StatusCode::kInvalidValue,
                  "stride " + std::to_string(layout.stride) + " < block_bytes " +
                      std::to_string(layout.block_bytes) + ": blocks would overlap");
  }
  if (layout.layers > 1 && layout.layer_stride == 0) {
    return Status(StatusCode::kInvalidValue, "layer_stride is 0 with several layers");
  }
  // end = base + (layers-1)*layer_stride + (block_count-1)*stride + block_bytes
  std::uint64_t end = 0;
  if (!mul_add(layout.layers - 1, layout.layer_stride, layout.base_offset, &end) ||
      !mul_add(layout.block_count - 1, layout.stride, end, &end) ||
      __builtin_add_overflow(end, layout.block_bytes, &end)) {
    return Status(StatusCode::kOutOfRange, "layout extent overflows 64 bits");
  }
  if (end > region_length) {
    return Status(StatusCode::kOutOfRange, "layout ends at byte " + std::to_string(end) +
                                               ", region has " + std::to_string(region_length));
  }
  return Status::ok();
}

Status validate_layout(const BlockLayout& layout, const RegionTable& regions) {
  const std::optional<Region> region = regions.lookup(layout.region);
  if (!region) {
    return Status(StatusCode::kNotFound,
                  "layout region " + std::to_string(layout.region) + " is not registered");
  }
  return validate_layout(layout, region->length);
}

}  // namespace pdr::transfer
