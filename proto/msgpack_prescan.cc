#include "proto/msgpack_prescan.h"

#include <cstdint>
#include <string>
#include <vector>

namespace pdr::proto {

namespace {

uint64_t read_be(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

// One element's header, as the msgpack spec lays it out.
struct Header {
  size_t header_bytes = 1;  // type byte and length field
  uint64_t payload = 0;     // bytes after the header: a scalar's value, a str/bin/ext's data
  uint64_t elements = 0;    // a container's declared elements (2 per map entry)
  uint64_t count = 0;       // a container's declared count (items or entries)
  bool container = false, map = false;
  // What msgpack checks this value's size against: none, str, bin or ext (ext's size counts the
  // type byte, as msgpack-cxx's visit_ext sees it).
  enum class Sized { kNone, kStr, kBin, kExt } sized = Sized::kNone;
};

// False when the header itself runs past the end or the byte is 0xc1 (never used): msgpack
// reports those.
bool read_header(const uint8_t* p, size_t left, Header* h) {
  const uint8_t b = p[0];
  const auto fixed = [&](size_t value_bytes) {
    h->payload = value_bytes;
    return true;
  };
  const auto sized = [&](size_t length_bytes, Header::Sized kind, size_t extra = 0) {
    if (left < 1 + length_bytes) return false;
    h->header_bytes = 1 + length_bytes;
    h->payload = read_be(p + 1, length_bytes) + extra;
    h->sized = kind;
    return true;
  };
  const auto container = [&](size_t length_bytes, uint64_t inline_count, bool map) {
    if (left < 1 + length_bytes) return false;
    h->header_bytes = 1 + length_bytes;
    h->count = length_bytes == 0 ? inline_count : read_be(p + 1, length_bytes);
    h->elements = map ? 2 * h->count : h->count;
    h->container = true;
    h->map = map;
    return true;
  };
  if (b <= 0x7f || b >= 0xe0) return fixed(0);               // fixint
  if (b <= 0x8f) return container(0, b & 0x0f, true);        // fixmap
  if (b <= 0x9f) return container(0, b & 0x0f, false);       // fixarray
  if (b <= 0xbf) {                                            // fixstr
    h->payload = b & 0x1f;
    h->sized = Header::Sized::kStr;
    return true;
  }
  switch (b) {
    case 0xc0: case 0xc2: case 0xc3: return fixed(0);         // nil, false, true
    case 0xc4: return sized(1, Header::Sized::kBin);
    case 0xc5: return sized(2, Header::Sized::kBin);
    case 0xc6: return sized(4, Header::Sized::kBin);
    case 0xc7: return sized(1, Header::Sized::kExt, 1);       // ext: the type byte follows the length
    case 0xc8: return sized(2, Header::Sized::kExt, 1);
    case 0xc9: return sized(4, Header::Sized::kExt, 1);
    case 0xca: return fixed(4);                               // float32
    case 0xcb: return fixed(8);                               // float64
    case 0xcc: case 0xd0: return fixed(1);                    // uint8, int8
    case 0xcd: case 0xd1: return fixed(2);
    case 0xce: case 0xd2: return fixed(4);
    case 0xcf: case 0xd3: return fixed(8);
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:    // fixext 1, 2, 4, 8, 16 (+ type)
      h->payload = (uint64_t{1} << (b - 0xd4)) + 1;
      h->sized = Header::Sized::kExt;
      return true;
    case 0xd9: return sized(1, Header::Sized::kStr);
    case 0xda: return sized(2, Header::Sized::kStr);
    case 0xdb: return sized(4, Header::Sized::kStr);
    case 0xdc: return container(2, 0, false);
    case 0xdd: return container(4, 0, false);
    case 0xde: return container(2, 0, true);
    case 0xdf: return container(4, 0, true);
    default: return false;                                    // 0xc1
  }
}

}  // namespace

Status check_declared_counts(std::span<const std::byte> bytes, const DecodeLimits& limits) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t size = bytes.size();
  size_t pos = 0;
  // Elements still to come in every open container together, plus the root until it is read.
  uint64_t pending = 1;
  // Elements still to come per open container, innermost last. msgpack counts a container as
  // open until its last element is complete, so one whose count reached 0 stays on the stack
  // (for the depth) until the elements after it close it.
  std::vector<uint64_t> open;
  while (pending > 0 && pos < size) {
    Header h;
    if (!read_header(data + pos, size - pos, &h)) return Status::ok();
    --pending;
    if (!open.empty()) --open.back();
    if (h.container) {
      // msgpack's own checks come first: its limit, then its depth (its stack holds the root
      // plus each open container).
      if (h.count > (h.map ? limits.max_map_entries : limits.max_array_items)) return Status::ok();
      if (open.size() + 1 > limits.max_depth) return Status::ok();
      pos += h.header_bytes;
      pending += h.elements;
      if (pending > size - pos) {
        return Status(StatusCode::kMalformed,
                      "msgpack data is truncated: the " + std::string(h.map ? "map" : "array") + " at byte " +
                          std::to_string(pos - h.header_bytes) + " declares " + std::to_string(h.count) +
                          (h.map ? " entries" : " items") + ", leaving " + std::to_string(pending) +
                          " elements to come in " + std::to_string(size - pos) + " bytes");
      }
      if (h.elements > 0) open.push_back(h.elements);
    } else {
      using Sized = Header::Sized;
      if ((h.sized == Sized::kStr && h.payload > limits.max_string_bytes) ||
          ((h.sized == Sized::kBin || h.sized == Sized::kExt) && h.payload > limits.max_bin_bytes)) {
        return Status::ok();
      }
      if (h.payload > size - pos - h.header_bytes) return Status::ok();  // runs past the end
      pos += h.header_bytes + h.payload;
    }
    while (!open.empty() && open.back() == 0) open.pop_back();
  }
  return Status::ok();
}

}  // namespace pdr::proto
