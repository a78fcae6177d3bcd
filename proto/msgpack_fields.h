// Private to proto/: typed, bounded reads of a decoded msgpack map (the output of unpack_bounded()
// in proto/msgpack_limits.h). Every failure is a Status whose message names the offending key;
// nothing here throws. The map and its strings are borrowed: the msgpack::object_handle that owns
// them must outlive every FieldMap / FieldReader built over it.
#pragma once

#include <msgpack.hpp>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/base/status.h"

namespace pdr::proto {

// ---- Encoding: a packer writing into a std::string ----
struct StringBuffer {
  std::string data;
  void write(const char* bytes, size_t size) { data.append(bytes, size); }
};
using Packer = msgpack::packer<StringBuffer>;

inline void pack_string(Packer& packer, std::string_view text) {
  packer.pack_str(static_cast<uint32_t>(text.size()));
  packer.pack_str_body(text.data(), static_cast<uint32_t>(text.size()));
}

// The bytes of a msgpack str object, borrowed. Precondition: value.type is STR.
std::string_view str_view(const msgpack::object& value);

// A msgpack map whose keys are all strings and unique, with lookup by key.
class FieldMap {
 public:
  // Fills *out from `map` (precondition: a MAP object). kWrongType for a non-string key,
  // kMalformed for a duplicate key; `name` ("payload", "labels", "load") is used in the message.
  static Status build(const msgpack::object& map, std::string_view name, FieldMap* out);

  // The value stored under `key`, or nullptr. Linear scan: maps are capped by DecodeLimits.
  const msgpack::object* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }
  // Every (key, value) in wire order.
  const std::vector<std::pair<std::string_view, const msgpack::object*>>& entries() const {
    return entries_;
  }

 private:
  std::vector<std::pair<std::string_view, const msgpack::object*>> entries_;
};

enum class Need { kRequired, kOptional };

// kWrongType: "<key> must be <expected>, got <msgpack type>".
Status wrong_type(std::string_view key, std::string_view expected, const msgpack::object& value);
// kOutOfRange: "<key> <value_text> is out of range <lo>..<hi>".
Status out_of_range(std::string_view key, std::string_view value_text, uint64_t lo, uint64_t hi);

// Copies a str value of at most max_bytes into *out; kWrongType / kTooLarge otherwise.
Status as_string(const msgpack::object& value, std::string_view key, size_t max_bytes,
                 std::string* out);
// An integer in lo..hi into *out. Any msgpack integer width or sign is accepted, then
// range-checked (kOutOfRange); a non-integer is kWrongType.
Status as_uint(const msgpack::object& value, std::string_view key, uint64_t lo, uint64_t hi,
               uint64_t* out);

// Typed reads of one map's keys; `context` ("a MoRIIO registration") names the message kind in
// kMissingKey errors. A missing Need::kOptional key leaves *out untouched and returns ok. Both
// `fields` and `context` are borrowed for the reader's lifetime.
class FieldReader {
 public:
  FieldReader(const FieldMap& fields, std::string_view context)
      : fields_(fields), context_(context) {}

  // The value under `key`, or nullptr; an optional key holding nil counts as absent.
  const msgpack::object* find(std::string_view key, Need need) const;

  // kMissingKey: "<key> is required for <context>".
  Status missing(std::string_view key) const;

  // as_string() on the key's value; *present (if given) says whether the key was there.
  Status string(std::string_view key, Need need, size_t max_bytes, std::string* out,
                bool* present = nullptr) const;

  // as_uint() on the key's value, narrowed to T (lo..hi must fit T); *present as for string().
  template <typename T>
  Status integer(std::string_view key, Need need, uint64_t lo, uint64_t hi, T* out,
                 bool* present = nullptr) const {
    const msgpack::object* value = find(key, need);
    if (present != nullptr) *present = value != nullptr;
    if (value == nullptr) return need == Need::kRequired ? missing(key) : Status::ok();
    uint64_t parsed = 0;
    if (Status s = as_uint(*value, key, lo, hi, &parsed); !s) return s;
    *out = static_cast<T>(parsed);
    return Status::ok();
  }

  // An optional integer key into a std::optional, set only when the key is present.
  template <typename T>
  Status optional_integer(std::string_view key, uint64_t lo, uint64_t hi,
                          std::optional<T>* out) const {
    bool present = false;
    T parsed{};
    if (Status s = integer(key, Need::kOptional, lo, hi, &parsed, &present); !s) return s;
    if (present) *out = parsed;
    return Status::ok();
  }

  // A msgpack bool; anything else is kWrongType.
  Status boolean(std::string_view key, Need need, bool* out) const;

  // An optional nested map (labels, load) as its own FieldMap; *present says whether the key was
  // there. A non-map is kWrongType.
  Status map(std::string_view key, FieldMap* out, bool* present) const;

 private:
  const FieldMap& fields_;
  std::string_view context_;
};

}  // namespace pdr::proto
