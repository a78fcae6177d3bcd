// Transfer descriptor codec (contract: transfer_descriptor.h). Untrusted bytes go through
// unpack_bounded() and FieldReader, the same path as the discovery messages, so every error names
// its key ("layouts[2].stride ...") and nothing msgpack throws escapes.
#include "proto/transfer_descriptor.h"

#include <algorithm>
#include <limits>
#include <utility>

#include <msgpack.hpp>

#include "proto/discovery_message.h"
#include "proto/msgpack_fields.h"
#include "proto/msgpack_limits.h"
#include "proto/quoted_text.h"

namespace pdr::proto {

namespace {

using msgpack::type::object_type;

constexpr uint64_t kMaxUint32 = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMaxUint64 = std::numeric_limits<uint64_t>::max();
constexpr std::string_view kContext = "a transfer descriptor";
// Room for a few unknown keys from newer writers, and for nesting one level deeper than v1 uses
// (map -> list -> item -> value).
constexpr size_t kMaxTopLevelKeys = 32;
constexpr size_t kMaxDepth = 5;
constexpr size_t kMinArrayItems = 16;  // positional items, with room for trailing additions
constexpr size_t kEnumNameBytes = 64;

constexpr size_t kEndpointItems = 2;
constexpr size_t kRegionItems = 3;
constexpr size_t kLayoutItems = 7;  // + an optional 8th, base_offset (omitted when 0)
constexpr size_t kRkeysItems = 2;

// ---- encoding ----


// ---- decoding ----

std::string item_name(std::string_view list, size_t index) {
  return std::string(list) + "[" + std::to_string(index) + "]";
}

std::string field_name(std::string_view list, size_t index, std::string_view field) {
  return item_name(list, index) + "." + std::string(field);
}

// The list under `key` (required) as a span of items, with its size checked against max_items.
Status read_list(const FieldReader& reader, std::string_view key, size_t max_items, Need need,
                 std::span<const msgpack::object>* out) {
  const msgpack::object* value = reader.find(key, need);
  if (value == nullptr) {
    *out = {};
    return need == Need::kRequired ? reader.missing(key) : Status::ok();
  }
  if (value->type != object_type::ARRAY) return wrong_type(key, "an array", *value);
  if (value->via.array.size > max_items) {
    return Status(StatusCode::kTooLarge, std::string(key) + " has " +
                                             std::to_string(value->via.array.size) +
                                             " items, limit " + std::to_string(max_items));
  }
  *out = {value->via.array.ptr, value->via.array.size};
  return Status::ok();
}

// Item `index` of `list` as a positional array of at least min_items values.
Status read_item(std::string_view list, size_t index, const msgpack::object& item,
                 size_t min_items, std::span<const msgpack::object>* out) {
  const std::string name = item_name(list, index);
  if (item.type != object_type::ARRAY) return wrong_type(name, "an array", item);
  if (item.via.array.size < min_items) {
    return Status(StatusCode::kMalformed, name + " has " + std::to_string(item.via.array.size) +
                                              " items, expected at least " +
                                              std::to_string(min_items));
  }
  *out = {item.via.array.ptr, item.via.array.size};
  return Status::ok();
}

template <typename T>
Status read_uint(const msgpack::object& value, const std::string& name, uint64_t hi, T* out) {
  uint64_t parsed = 0;
  if (Status s = as_uint(value, name, 0, hi, &parsed); !s) return s;
  *out = static_cast<T>(parsed);
  return Status::ok();
}

Status read_endpoints(const FieldReader& reader, const DescriptorLimits& limits,
                      std::vector<DescriptorEndpoint>* out) {
  std::span<const msgpack::object> list;
  if (Status s = read_list(reader, "endpoints", limits.max_endpoints, Need::kRequired, &list); !s)
    return s;
  out->resize(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    std::span<const msgpack::object> item;
    if (Status s = read_item("endpoints", i, list[i], kEndpointItems, &item); !s) return s;
    DescriptorEndpoint& endpoint = (*out)[i];
    const std::string backend_key = field_name("endpoints", i, "backend");
    std::string backend;
    if (Status s = as_string(item[0], backend_key, kEnumNameBytes, &backend); !s) return s;
    if (!parse_endpoint_backend(backend, &endpoint.backend)) {
      return Status(StatusCode::kInvalidValue,
                    backend_key + " " + quote_untrusted(backend) + " is not tcp, shm or rdma");
    }
    if (Status s = as_string(item[1], field_name("endpoints", i, "address"),
                             limits.max_string_bytes, &endpoint.address);
        !s) {
      return s;
    }
  }
  return Status::ok();
}

Status read_regions(const FieldReader& reader, const DescriptorLimits& limits,
                    std::vector<DescriptorRegion>* out) {
  std::span<const msgpack::object> list;
  if (Status s = read_list(reader, "regions", limits.max_regions, Need::kRequired, &list); !s)
    return s;
  out->resize(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    std::span<const msgpack::object> item;
    if (Status s = read_item("regions", i, list[i], kRegionItems, &item); !s) return s;
    DescriptorRegion& region = (*out)[i];
    if (Status s = read_uint(item[0], field_name("regions", i, "id"), kMaxUint32, &region.id); !s)
      return s;
    if (Status s = read_uint(item[1], field_name("regions", i, "length"), kMaxUint64,
                             &region.length);
        !s) {
      return s;
    }
    const std::string kind_key = field_name("regions", i, "kind");
    std::string kind;
    if (Status s = as_string(item[2], kind_key, kEnumNameBytes, &kind); !s) return s;
    if (!parse_region_kind(kind, &region.kind)) {
      return Status(StatusCode::kInvalidValue,
                    kind_key + " " + quote_untrusted(kind) + " is not dram or vram");
    }
  }
  return Status::ok();
}

Status read_layouts(const FieldReader& reader, const DescriptorLimits& limits,
                    std::vector<DescriptorLayout>* out) {
  std::span<const msgpack::object> list;
  if (Status s = read_list(reader, "layouts", limits.max_layouts, Need::kRequired, &list); !s)
    return s;
  out->resize(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    std::span<const msgpack::object> item;
    if (Status s = read_item("layouts", i, list[i], kLayoutItems, &item); !s) return s;
    DescriptorLayout& layout = (*out)[i];
    auto name = [&](std::string_view field) { return field_name("layouts", i, field); };
    Status s = read_uint(item[0], name("id"), kMaxUint32, &layout.id);
    if (s) s = read_uint(item[1], name("region_id"), kMaxUint32, &layout.region_id);
    if (s) s = read_uint(item[2], name("block_bytes"), kMaxUint64, &layout.block_bytes);
    if (s) s = read_uint(item[3], name("stride"), kMaxUint64, &layout.stride);
    if (s) s = read_uint(item[4], name("block_count"), kMaxUint32, &layout.block_count);
    if (s) s = read_uint(item[5], name("layers"), kMaxUint32, &layout.layers);
    if (s) s = read_uint(item[6], name("layer_stride"), kMaxUint64, &layout.layer_stride);
    layout.base_offset = 0;
    if (s && item.size() > kLayoutItems) {
      s = read_uint(item[7], name("base_offset"), kMaxUint64, &layout.base_offset);
    }
    if (!s) return s;
  }
  return Status::ok();
}

Status read_rkeys(const FieldReader& reader, const DescriptorLimits& limits,
                  std::vector<DescriptorRkeys>* out) {
  std::span<const msgpack::object> list;
  if (Status s = read_list(reader, "rkeys", limits.max_regions, Need::kOptional, &list); !s)
    return s;
  out->resize(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    std::span<const msgpack::object> item;
    if (Status s = read_item("rkeys", i, list[i], kRkeysItems, &item); !s) return s;
    DescriptorRkeys& rkeys = (*out)[i];
    if (Status s = read_uint(item[0], field_name("rkeys", i, "region_id"), kMaxUint32,
                             &rkeys.region_id);
        !s) {
      return s;
    }
    const std::string keys_key = field_name("rkeys", i, "keys");
    if (item[1].type != object_type::BIN) return wrong_type(keys_key, "bin", item[1]);
    if (item[1].via.bin.size > limits.max_rkey_bytes) {
      return Status(StatusCode::kTooLarge, keys_key + " is " +
                                               std::to_string(item[1].via.bin.size) +
                                               " bytes, limit " +
                                               std::to_string(limits.max_rkey_bytes));
    }
    rkeys.keys.assign(item[1].via.bin.ptr, item[1].via.bin.size);
  }
  return Status::ok();
}

Status read_secret(const FieldReader& reader, std::string* out) {
  const msgpack::object* value = reader.find("secret", Need::kOptional);
  out->clear();
  if (value == nullptr) return Status::ok();
  if (value->type != object_type::BIN) return wrong_type("secret", "bin", *value);
  // The exact size is validate_descriptor()'s check; unpack_bounded() already bounded the copy.
  out->assign(value->via.bin.ptr, value->via.bin.size);
  return Status::ok();
}

// ---- validation ----

Status check_string(std::string_view name, const std::string& value, size_t max_bytes,
                    bool allow_empty) {
  if (!allow_empty && value.empty()) {
    return Status(StatusCode::kInvalidValue, std::string(name) + " must not be empty");
  }
  if (value.size() > max_bytes) {
    return Status(StatusCode::kTooLarge, std::string(name) + " is " +
                                             std::to_string(value.size()) + " bytes, limit " +
                                             std::to_string(max_bytes));
  }
  return Status::ok();
}

Status check_count(std::string_view name, size_t count, size_t limit) {
  if (count > limit) {
    return Status(StatusCode::kTooLarge, std::string(name) + " has " + std::to_string(count) +
                                             " items, limit " + std::to_string(limit));
  }
  return Status::ok();
}

// Index of the first item whose id repeats an earlier one, or `ids.size()`.
size_t first_duplicate(const std::vector<uint32_t>& ids) {
  for (size_t i = 1; i < ids.size(); ++i) {
    if (std::find(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(i), ids[i]) !=
        ids.begin() + static_cast<std::ptrdiff_t>(i)) {
      return i;
    }
  }
  return ids.size();
}

Status check_unique(std::string_view list, std::string_view field,
                    const std::vector<uint32_t>& ids) {
  const size_t at = first_duplicate(ids);
  if (at == ids.size()) return Status::ok();
  return Status(StatusCode::kMalformed, field_name(list, at, field) + " " +
                                            std::to_string(ids[at]) + " is not unique");
}

const DescriptorRegion* find_region(const std::vector<DescriptorRegion>& regions, uint32_t id) {
  for (const DescriptorRegion& region : regions) {
    if (region.id == id) return &region;
  }
  return nullptr;
}

Status check_layout(const DescriptorLayout& layout, size_t index,
                    const std::vector<DescriptorRegion>& regions) {
  const std::string name = item_name("layouts", index);
  const DescriptorRegion* region = find_region(regions, layout.region_id);
  if (region == nullptr) {
    return Status(StatusCode::kMalformed,
                  name + ".region_id " + std::to_string(layout.region_id) + " names no region");
  }
  auto at_least_one = [&](std::string_view field, uint64_t value) {
    if (value >= 1) return Status::ok();
    return Status(StatusCode::kInvalidValue, name + " " + std::string(field) +
                                                 " must be at least 1");
  };
  if (Status s = at_least_one("block_bytes", layout.block_bytes); !s) return s;
  if (Status s = at_least_one("block_count", layout.block_count); !s) return s;
  if (Status s = at_least_one("layers", layout.layers); !s) return s;
  uint64_t extent = 0;
  uint64_t layers_span = 0;
  if (!layout_extent(layout, &extent) ||
      __builtin_mul_overflow(uint64_t{layout.layers}, layout.layer_stride, &layers_span)) {
    return Status(StatusCode::kOutOfRange, name + " extent overflows 64 bits");
  }
  uint64_t needed = 0;
  if (__builtin_add_overflow(layout.base_offset, layers_span, &layers_span) ||
      __builtin_add_overflow(layout.base_offset, extent, &extent)) {
    return Status(StatusCode::kOutOfRange, name + " extent overflows 64 bits");
  }
  needed = std::max(extent, layers_span);
  if (needed > region->length) {
    return Status(StatusCode::kOutOfRange, name + " needs " + std::to_string(needed) +
                                               " bytes, region " + std::to_string(region->id) +
                                               " has " + std::to_string(region->length));
  }
  return Status::ok();
}

}  // namespace

std::string_view to_string(EndpointBackend backend) {
  switch (backend) {
    case EndpointBackend::kTcp: return "tcp";
    case EndpointBackend::kShm: return "shm";
    case EndpointBackend::kRdma: return "rdma";
  }
  return "unknown";
}

std::string_view to_string(RegionKind kind) {
  switch (kind) {
    case RegionKind::kDram: return "dram";
    case RegionKind::kVram: return "vram";
  }
  return "unknown";
}

bool parse_endpoint_backend(std::string_view text, EndpointBackend* out) {
  for (EndpointBackend backend :
       {EndpointBackend::kTcp, EndpointBackend::kShm, EndpointBackend::kRdma}) {
    if (text == to_string(backend)) {
      *out = backend;
      return true;
    }
  }
  return false;
}

bool parse_region_kind(std::string_view text, RegionKind* out) {
  for (RegionKind kind : {RegionKind::kDram, RegionKind::kVram}) {
    if (text == to_string(kind)) {
      *out = kind;
      return true;
    }
  }
  return false;
}

bool layout_extent(const DescriptorLayout& layout, uint64_t* extent) {
  if (layout.block_bytes == 0 || layout.block_count == 0 || layout.layers == 0) return false;
  uint64_t layers_part = 0;
  uint64_t blocks_part = 0;
  uint64_t sum = 0;
  if (__builtin_mul_overflow(uint64_t{layout.layers} - 1, layout.layer_stride, &layers_part) ||
      __builtin_mul_overflow(uint64_t{layout.block_count} - 1, layout.stride, &blocks_part) ||
      __builtin_add_overflow(layers_part, blocks_part, &sum) ||
      __builtin_add_overflow(sum, layout.block_bytes, &sum)) {
    return false;
  }
  *extent = sum;
  return true;
}

Status validate_descriptor(const TransferDescriptor& d, const DescriptorLimits& limits) {
  if (d.version_major < 1) return out_of_range("v", "0", 1, kMaxUint32);
  if (d.version_major > kTransferDescriptorMajor) {
    return Status(StatusCode::kRejected, "descriptor major version " +
                                             std::to_string(d.version_major) +
                                             " is newer than supported " +
                                             std::to_string(kTransferDescriptorMajor));
  }
  if (Status s = check_string("agent", d.agent, limits.max_string_bytes, false); !s) return s;
  if (Status s = check_string("hostname", d.hostname, limits.max_string_bytes, true); !s) return s;
  if (Status s = check_string("boot_id", d.boot_id, limits.max_string_bytes, true); !s) return s;
  if (Status s = check_count("endpoints", d.endpoints.size(), limits.max_endpoints); !s) return s;
  if (Status s = check_count("regions", d.regions.size(), limits.max_regions); !s) return s;
  if (Status s = check_count("layouts", d.layouts.size(), limits.max_layouts); !s) return s;
  if (Status s = check_count("rkeys", d.rkeys.size(), limits.max_regions); !s) return s;

  for (size_t i = 0; i < d.endpoints.size(); ++i) {
    if (Status s = check_string(field_name("endpoints", i, "address"), d.endpoints[i].address,
                                limits.max_string_bytes, false);
        !s) {
      return s;
    }
  }

  std::vector<uint32_t> ids;
  for (const DescriptorRegion& region : d.regions) ids.push_back(region.id);
  if (Status s = check_unique("regions", "id", ids); !s) return s;

  ids.clear();
  for (const DescriptorLayout& layout : d.layouts) ids.push_back(layout.id);
  if (Status s = check_unique("layouts", "id", ids); !s) return s;
  for (size_t i = 0; i < d.layouts.size(); ++i) {
    if (Status s = check_layout(d.layouts[i], i, d.regions); !s) return s;
  }

  ids.clear();
  for (const DescriptorRkeys& rkeys : d.rkeys) ids.push_back(rkeys.region_id);
  if (Status s = check_unique("rkeys", "region_id", ids); !s) return s;
  for (size_t i = 0; i < d.rkeys.size(); ++i) {
    if (find_region(d.regions, d.rkeys[i].region_id) == nullptr) {
      return Status(StatusCode::kMalformed, field_name("rkeys", i, "region_id") + " " +
                                                std::to_string(d.rkeys[i].region_id) +
                                                " names no region");
    }
    if (d.rkeys[i].keys.size() > limits.max_rkey_bytes) {
      return Status(StatusCode::kTooLarge, field_name("rkeys", i, "keys") + " is " +
                                               std::to_string(d.rkeys[i].keys.size()) +
                                               " bytes, limit " +
                                               std::to_string(limits.max_rkey_bytes));
    }
  }
  if (!d.secret.empty() && d.secret.size() != kTransferSecretBytes) {
    return Status(StatusCode::kInvalidValue, "secret is " + std::to_string(d.secret.size()) +
                                                 " bytes, must be " +
                                                 std::to_string(kTransferSecretBytes));
  }
  return Status::ok();
}

std::string encode_descriptor(const TransferDescriptor& d) {
  StringBuffer buffer;
  Packer packer(buffer);
  const bool has_minor = d.version_minor != 0;
  const bool has_rkeys = !d.rkeys.empty();
  const bool has_secret = !d.secret.empty();
  packer.pack_map(7 + (has_minor ? 1 : 0) + (has_rkeys ? 1 : 0) + (has_secret ? 1 : 0));
  pack_string(packer, "v");
  packer.pack_uint32(d.version_major);
  if (has_minor) {
    pack_string(packer, "v_minor");
    packer.pack_uint32(d.version_minor);
  }
  pack_string(packer, "agent");
  pack_string(packer, d.agent);
  pack_string(packer, "hostname");
  pack_string(packer, d.hostname);
  pack_string(packer, "boot_id");
  pack_string(packer, d.boot_id);

  pack_string(packer, "endpoints");
  packer.pack_array(static_cast<uint32_t>(d.endpoints.size()));
  for (const DescriptorEndpoint& endpoint : d.endpoints) {
    packer.pack_array(kEndpointItems);
    pack_string(packer, to_string(endpoint.backend));
    pack_string(packer, endpoint.address);
  }

  pack_string(packer, "regions");
  packer.pack_array(static_cast<uint32_t>(d.regions.size()));
  for (const DescriptorRegion& region : d.regions) {
    packer.pack_array(kRegionItems);
    packer.pack_uint32(region.id);
    packer.pack_uint64(region.length);
    pack_string(packer, to_string(region.kind));
  }

  pack_string(packer, "layouts");
  packer.pack_array(static_cast<uint32_t>(d.layouts.size()));
  for (const DescriptorLayout& layout : d.layouts) {
    packer.pack_array(layout.base_offset != 0 ? kLayoutItems + 1 : kLayoutItems);
    packer.pack_uint32(layout.id);
    packer.pack_uint32(layout.region_id);
    packer.pack_uint64(layout.block_bytes);
    packer.pack_uint64(layout.stride);
    packer.pack_uint32(layout.block_count);
    packer.pack_uint32(layout.layers);
    packer.pack_uint64(layout.layer_stride);
    if (layout.base_offset != 0) packer.pack_uint64(layout.base_offset);
  }

  if (has_rkeys) {
    pack_string(packer, "rkeys");
    packer.pack_array(static_cast<uint32_t>(d.rkeys.size()));
    for (const DescriptorRkeys& rkeys : d.rkeys) {
      packer.pack_array(kRkeysItems);
      packer.pack_uint32(rkeys.region_id);
      packer.pack_bin(static_cast<uint32_t>(rkeys.keys.size()));
      packer.pack_bin_body(rkeys.keys.data(), static_cast<uint32_t>(rkeys.keys.size()));
    }
  }
  if (has_secret) {
    pack_string(packer, "secret");
    packer.pack_bin(static_cast<uint32_t>(d.secret.size()));
    packer.pack_bin_body(d.secret.data(), static_cast<uint32_t>(d.secret.size()));
  }
  return std::move(buffer.data);
}

Status decode_descriptor(std::span<const std::byte> bytes, const DescriptorLimits& limits,
                         TransferDescriptor* out) {
  DecodeLimits unpack_limits;
  unpack_limits.max_message_bytes = limits.max_bytes;
  unpack_limits.max_depth = kMaxDepth;
  // One more than the largest list limit, so an over-long list gets the precise per-key message.
  unpack_limits.max_array_items =
      std::max({limits.max_endpoints, limits.max_regions, limits.max_layouts, kMinArrayItems}) + 1;
  unpack_limits.max_map_entries = kMaxTopLevelKeys;
  // A str or bin is copied only once all its bytes are present, so the message size already bounds
  // it; the per-field limits are applied afterwards, with messages that name the field.
  unpack_limits.max_string_bytes = limits.max_bytes;
  unpack_limits.max_bin_bytes = limits.max_bytes;

  msgpack::object_handle handle;
  if (Status s = unpack_bounded(bytes, unpack_limits, &handle); !s) return s;
  const msgpack::object& root = handle.get();
  if (root.type != object_type::MAP) {
    return Status(StatusCode::kWrongType,
                  "descriptor must be a map, got " + std::string(msgpack_type_name(root)));
  }
  FieldMap fields;
  if (Status s = FieldMap::build(root, "descriptor", &fields); !s) return s;
  const FieldReader reader(fields, kContext);

  *out = TransferDescriptor{};
  out->version_minor = 0;  // absent v_minor: a v1.0 writer
  // The major version first: a newer writer may have changed everything else.
  if (Status s = reader.integer("v", Need::kRequired, 1, kMaxUint32, &out->version_major); !s)
    return s;
  if (out->version_major > kTransferDescriptorMajor) return validate_descriptor(*out, limits);
  Status s = reader.integer("v_minor", Need::kOptional, 0, kMaxUint32, &out->version_minor);
  if (s) s = reader.string("agent", Need::kRequired, limits.max_string_bytes, &out->agent);
  if (s) s = reader.string("hostname", Need::kRequired, limits.max_string_bytes, &out->hostname);
  if (s) s = reader.string("boot_id", Need::kRequired, limits.max_string_bytes, &out->boot_id);
  if (s) s = read_endpoints(reader, limits, &out->endpoints);
  if (s) s = read_regions(reader, limits, &out->regions);
  if (s) s = read_layouts(reader, limits, &out->layouts);
  if (s) s = read_rkeys(reader, limits, &out->rkeys);
  if (s) s = read_secret(reader, &out->secret);
  if (!s) return s;
  return validate_descriptor(*out, limits);
}

}  // namespace pdr::proto
