#include "proto/msgpack_fields.h"

#include <algorithm>

#include "proto/msgpack_limits.h"
#include "proto/quoted_text.h"

namespace pdr::proto {

using msgpack::type::object_type;

std::string_view str_view(const msgpack::object& value) {
  return {value.via.str.ptr, value.via.str.size};
}

Status FieldMap::build(const msgpack::object& map, std::string_view name, FieldMap* out) {
  out->entries_.clear();
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object_kv& kv = map.via.map.ptr[i];
    if (kv.key.type != object_type::STR) {
      return Status(StatusCode::kWrongType, std::string(name) + " keys must be strings, got " +
                                                std::string(msgpack_type_name(kv.key)));
    }
    out->entries_.emplace_back(str_view(kv.key), &kv.val);
  }
  std::vector<std::string_view> keys;
  keys.reserve(out->entries_.size());
  for (const auto& entry : out->entries_) keys.push_back(entry.first);
  std::sort(keys.begin(), keys.end());
  const auto duplicate = std::adjacent_find(keys.begin(), keys.end());
  if (duplicate != keys.end()) {
    return Status(StatusCode::kMalformed, "key " + quote_untrusted(*duplicate) +
                                              " appears twice in " + std::string(name));
  }
  return Status::ok();
}

const msgpack::object* FieldMap::find(std::string_view key) const {
  for (const auto& [name, value] : entries_) {
    if (name == key) return value;
  }
  return nullptr;
}

Status wrong_type(std::string_view key, std::string_view expected, const msgpack::object& value) {
  return Status(StatusCode::kWrongType, std::string(key) + " must be " + std::string(expected) +
                                            ", got " + std::string(msgpack_type_name(value)));
}

Status out_of_range(std::string_view key, std::string_view value_text, uint64_t lo, uint64_t hi) {
  return Status(StatusCode::kOutOfRange, std::string(key) + " " + std::string(value_text) +
                                             " is out of range " + std::to_string(lo) + ".." +
                                             std::to_string(hi));
}

Status as_string(const msgpack::object& value, std::string_view key, size_t max_bytes,
                 std::string* out) {
  if (value.type != object_type::STR) return wrong_type(key, "a string", value);
  if (value.via.str.size > max_bytes) {
    return Status(StatusCode::kTooLarge, std::string(key) + " is " +
                                             std::to_string(value.via.str.size) + " bytes, limit " +
                                             std::to_string(max_bytes));
  }
  out->assign(value.via.str.ptr, value.via.str.size);
  return Status::ok();
}

Status as_uint(const msgpack::object& value, std::string_view key, uint64_t lo, uint64_t hi,
               uint64_t* out) {
  if (value.type == object_type::NEGATIVE_INTEGER) {
    return out_of_range(key, std::to_string(value.via.i64), lo, hi);
  }
  if (value.type != object_type::POSITIVE_INTEGER) return wrong_type(key, "an integer", value);
  if (value.via.u64 < lo || value.via.u64 > hi) {
    return out_of_range(key, std::to_string(value.via.u64), lo, hi);
  }
  *out = value.via.u64;
  return Status::ok();
}

// Python clients send None for "not set", so an optional nil is treated as absent.
const msgpack::object* FieldReader::find(std::string_view key, Need need) const {
  const msgpack::object* value = fields_.find(key);
  if (value != nullptr && need == Need::kOptional && value->type == object_type::NIL)
    return nullptr;
  return value;
}

Status FieldReader::missing(std::string_view key) const {
  return Status(StatusCode::kMissingKey,
                std::string(key) + " is required for " + std::string(context_));
}

Status FieldReader::string(std::string_view key, Need need, size_t max_bytes, std::string* out,
                           bool* present) const {
  const msgpack::object* value = find(key, need);
  if (present != nullptr) *present = value != nullptr;
  if (value == nullptr) return need == Need::kRequired ? missing(key) : Status::ok();
  return as_string(*value, key, max_bytes, out);
}

Status FieldReader::boolean(std::string_view key, Need need, bool* out) const {
  const msgpack::object* value = find(key, need);
  if (value == nullptr) return need == Need::kRequired ? missing(key) : Status::ok();
  if (value->type != object_type::BOOLEAN) return wrong_type(key, "a bool", *value);
  *out = value->via.boolean;
  return Status::ok();
}

Status FieldReader::map(std::string_view key, FieldMap* out, bool* present) const {
  const msgpack::object* value = find(key, Need::kOptional);
  *present = value != nullptr;
  if (value == nullptr) return Status::ok();
  if (value->type != object_type::MAP) return wrong_type(key, "a map", *value);
  return FieldMap::build(*value, key, out);
}

}  // namespace pdr::proto
