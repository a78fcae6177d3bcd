#include "proto/msgpack_limits.h"

#include <new>
#include <string>
#include <vector>

#include "proto/msgpack_prescan.h"

namespace pdr::proto {

namespace {

using msgpack::type::object_type;

std::string limit_text(size_t limit) { return std::to_string(limit); }

Status size_overflow_status(std::string_view what, size_t limit) {
  // bin and ext are never valid in discovery messages; with limit 0 any non-empty one lands here.
  if (limit == 0) {
    return Status(StatusCode::kWrongType, std::string(what) + " values are not allowed");
  }
  return Status(StatusCode::kTooLarge,
                "a " + std::string(what) + " value is larger than " + limit_text(limit) + " bytes");
}

Status unpack_or_status(const char* data, size_t size, const DecodeLimits& limits, size_t* offset,
                        msgpack::object_handle* out) {
  const msgpack::unpack_limit limit(limits.max_array_items, limits.max_map_entries,
                                    limits.max_string_bytes, limits.max_bin_bytes,
                                    limits.max_bin_bytes, limits.max_depth);
  try {
    *out = msgpack::unpack(data, size, *offset, nullptr, nullptr, limit);
    return Status::ok();
  } catch (const msgpack::depth_size_overflow&) {
    return Status(StatusCode::kTooDeep,
                  "nesting is deeper than " + limit_text(limits.max_depth) + " levels");
  } catch (const msgpack::array_size_overflow&) {
    return Status(StatusCode::kTooLarge,
                  "an array has more than " + limit_text(limits.max_array_items) + " items");
  } catch (const msgpack::map_size_overflow&) {
    return Status(StatusCode::kTooLarge,
                  "a map has more than " + limit_text(limits.max_map_entries) + " entries");
  } catch (const msgpack::str_size_overflow&) {
    return Status(StatusCode::kTooLarge,
                  "a string is longer than " + limit_text(limits.max_string_bytes) + " bytes");
  } catch (const msgpack::bin_size_overflow&) {
    return size_overflow_status("bin", limits.max_bin_bytes);
  } catch (const msgpack::ext_size_overflow&) {
    return size_overflow_status("ext", limits.max_bin_bytes);
  } catch (const msgpack::insufficient_bytes&) {
    return Status(StatusCode::kMalformed, "msgpack data is truncated");
  } catch (const msgpack::parse_error&) {
    return Status(StatusCode::kMalformed, "invalid msgpack data");
  } catch (const msgpack::unpack_error& e) {
    return Status(StatusCode::kMalformed, std::string("invalid msgpack data: ") + e.what());
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::kInternal, "out of memory while decoding msgpack");
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, std::string("msgpack decoder failed: ") + e.what());
  } catch (...) {
    return Status(StatusCode::kInternal, "msgpack decoder failed");
  }
}

}  // namespace

Status unpack_bounded(std::span<const std::byte> bytes, const DecodeLimits& limits,
                      msgpack::object_handle* out) {
  if (bytes.size() > limits.max_message_bytes) {
    return Status(StatusCode::kTooLarge, "message is " + std::to_string(bytes.size()) +
                                             " bytes, limit " +
                                             limit_text(limits.max_message_bytes));
  }
  if (bytes.empty()) return Status(StatusCode::kMalformed, "message is empty");
  // msgpack-cxx allocates a container's slots at its header: first make sure the bytes could hold
  // what the headers declare (proto/msgpack_prescan.h).
  if (Status s = check_declared_counts(bytes, limits); !s) return s;
  size_t offset = 0;
  const auto* data = reinterpret_cast<const char*>(bytes.data());
  if (Status s = unpack_or_status(data, bytes.size(), limits, &offset, out); !s) return s;
  if (offset != bytes.size()) {
    return Status(StatusCode::kMalformed, std::to_string(bytes.size() - offset) +
                                              " trailing bytes after the msgpack object");
  }
  return Status::ok();
}

Status reject_bin_and_ext(const msgpack::object& value, std::string_view where) {
  std::vector<const msgpack::object*> pending{&value};
  while (!pending.empty()) {
    const msgpack::object* current = pending.back();
    pending.pop_back();
    switch (current->type) {
      case object_type::BIN:
      case object_type::EXT:
        return Status(StatusCode::kWrongType, std::string(where) + " holds a " +
                                                  std::string(msgpack_type_name(*current)) +
                                                  " value; bin and ext are not allowed");
      case object_type::ARRAY:
        for (uint32_t i = 0; i < current->via.array.size; ++i) {
          pending.push_back(&current->via.array.ptr[i]);
        }
        break;
      case object_type::MAP:
        for (uint32_t i = 0; i < current->via.map.size; ++i) {
          pending.push_back(&current->via.map.ptr[i].key);
          pending.push_back(&current->via.map.ptr[i].val);
        }
        break;
      default: break;
    }
  }
  return Status::ok();
}

std::string_view msgpack_type_name(const msgpack::object& value) {
  switch (value.type) {
    case object_type::NIL: return "nil";
    case object_type::BOOLEAN: return "bool";
    case object_type::POSITIVE_INTEGER:
    case object_type::NEGATIVE_INTEGER: return "int";
    case object_type::FLOAT32:
    case object_type::FLOAT64: return "float";
    case object_type::STR: return "str";
    case object_type::BIN: return "bin";
    case object_type::ARRAY: return "array";
    case object_type::MAP: return "map";
    case object_type::EXT: return "ext";
  }
  return "unknown";
}

}  // namespace pdr::proto
