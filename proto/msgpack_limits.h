// Private to proto/: the one place untrusted bytes meet msgpack-cxx.
//
// unpack_bounded() checks the byte size before parsing, refuses containers that declare more
// elements than the bytes left could hold (proto/msgpack_prescan.h: msgpack allocates a
// container's slots at its header), passes DecodeLimits to msgpack as an unpack_limit (so a huge
// declared array/map/str header fails before anything is allocated), rejects trailing bytes after
// the first object and catches every msgpack exception, returning a Status instead. Nothing
// thrown by msgpack escapes.
#pragma once

#include <msgpack.hpp>
#include <span>
#include <string_view>

#include "proto/discovery_message.h"
#include "proto/base/status.h"

namespace pdr::proto {

// On success *out owns exactly one object that used all of `bytes`.
// Errors: kTooLarge (bytes over max_message_bytes, or an array/map/str over its limit), kTooDeep,
// kMalformed (empty, truncated, containers declaring more elements than the bytes hold, invalid
// msgpack, trailing bytes), kWrongType (bin/ext when their limit is 0), kInternal (allocation
// failure).
Status unpack_bounded(std::span<const std::byte> bytes, const DecodeLimits& limits,
                      msgpack::object_handle* out);

// kWrongType naming `where` when a bin or ext value appears anywhere inside `value` (iterative, so
// the walk is safe whatever the depth limit).
Status reject_bin_and_ext(const msgpack::object& value, std::string_view where);

// "nil", "bool", "int", "float", "str", "bin", "array", "map", "ext": for error messages.
std::string_view msgpack_type_name(const msgpack::object& value);

}  // namespace pdr::proto
