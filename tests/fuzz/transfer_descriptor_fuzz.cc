// libFuzzer target for the transfer descriptor codec (proto/transfer_descriptor.h).
//
// Besides "no crash, no sanitizer report, no exception", it checks a round-trip property: every
// descriptor that decodes passes validate_descriptor(), re-encodes, and decodes again to exactly
// the same struct (the optional secret included), whose encoding is byte-identical to the first one. Every layout that passed also
// really fits its region (recomputed here in 128-bit arithmetic).
// Seed corpus: tests/fuzz/corpus/transfer_descriptor/ (msgpack.packb of valid descriptors).
#include <cstddef>
#include <cstdint>
#include <string>

#include "proto/discovery_message.h"  // as_bytes()
#include "proto/transfer_descriptor.h"

namespace {

using pdr::proto::DescriptorLimits;
using pdr::proto::TransferDescriptor;

void check_layouts_fit(const TransferDescriptor& d) {
  for (const auto& layout : d.layouts) {
    const pdr::proto::DescriptorRegion* region = nullptr;
    for (const auto& candidate : d.regions) {
      if (candidate.id == layout.region_id) region = &candidate;
    }
    if (region == nullptr) __builtin_trap();
    using u128 = unsigned __int128;
    const u128 extent = u128{layout.layers - 1u} * layout.layer_stride +
                        u128{layout.block_count - 1u} * layout.stride + layout.block_bytes;
    if (layout.layers == 0 || layout.block_count == 0 || layout.block_bytes == 0) __builtin_trap();
    if (extent > region->length) __builtin_trap();
    if (u128{layout.layers} * layout.layer_stride > region->length) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const DescriptorLimits limits;
  TransferDescriptor descriptor;
  if (!pdr::proto::decode_descriptor(bytes, limits, &descriptor)) return 0;
  if (!pdr::proto::validate_descriptor(descriptor, limits)) __builtin_trap();
  check_layouts_fit(descriptor);
  const std::string encoded = pdr::proto::encode_descriptor(descriptor);
  TransferDescriptor again;
  if (!pdr::proto::decode_descriptor(pdr::proto::as_bytes(encoded), limits, &again)) {
    __builtin_trap();  // our own encoding of a valid descriptor must always decode
  }
  if (!(again == descriptor)) __builtin_trap();
  if (pdr::proto::encode_descriptor(again) != encoded) __builtin_trap();
  return 0;
}
