// Fuzzes proto/msgpack_prescan (the pass that refuses msgpack containers declaring more elements
// than the bytes left could hold) against msgpack-cxx itself, which parses the same bytes under
// the same limits without the pass. Property, besides no crash and no sanitizer report: the pass
// never refuses bytes whose first object msgpack-cxx decodes in full (a false refusal would drop a
// node's good batch), i.e. whatever it refuses is truncated indeed.
// Seed corpus: tests/fuzz/corpus/msgpack_prescan/ (the discovery and KV events seeds, copied).
#include <cstddef>
#include <cstdint>
#include <span>

#include <msgpack.hpp>

#include "proto/msgpack_prescan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pdr::proto::DecodeLimits limits;
  limits.max_message_bytes = 1 << 20;
  limits.max_depth = 8;
  limits.max_array_items = 1 << 12;  // msgpack's slots stay small even without the pass
  limits.max_map_entries = 1 << 10;
  limits.max_string_bytes = 1 << 16;
  limits.max_bin_bytes = 1 << 16;
  const auto bytes = std::as_bytes(std::span<const uint8_t>(data, size));
  const bool passes = pdr::proto::check_declared_counts(bytes, limits).is_ok();

  bool decodes = false;
  try {
    const msgpack::unpack_limit limit(limits.max_array_items, limits.max_map_entries, limits.max_string_bytes,
                                      limits.max_bin_bytes, limits.max_bin_bytes, limits.max_depth);
    size_t offset = 0;
    msgpack::object_handle handle =
        msgpack::unpack(reinterpret_cast<const char*>(data), size, offset, nullptr, nullptr, limit);
    decodes = true;  // the first object is complete (trailing bytes do not matter here)
  } catch (...) {
  }
  if (decodes && !passes) __builtin_trap();
  return 0;
}
