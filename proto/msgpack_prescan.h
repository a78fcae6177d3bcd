// Private to proto/: a pass over raw msgpack bytes, before msgpack-cxx parses them, that refuses
// containers declaring more elements than the bytes left could hold.
//
// Why: msgpack-cxx allocates an array's (or map's) element slots, 24 (or 48) bytes each, when it
// reads the header, before any element arrives; its unpack_limit only caps each declared count.
// So a few bytes of nested array32 headers (45 bytes: 8 of them, 1,048,576 items each) make it ask
// for hundreds of megabytes. Every element takes at least one byte, so a document whose open
// containers still expect more elements than there are bytes left can never complete: it is
// truncated, and is refused here before msgpack allocates anything for it. For a payload that
// passes, msgpack's slots come to 24 bytes per element the payload really holds, and it holds at
// most one element per byte.
//
// The pass reads headers only (iterative, a few operations per element, no allocation beyond the
// stack of open containers, at most limits.max_depth deep). Wherever msgpack-cxx would stop with
// an error of its own first (a count, string, bin or ext over its limit, nesting too deep, the
// reserved byte 0xc1, a value running past the end), the pass stops and lets msgpack report it,
// so those errors keep their own messages.
#pragma once

#include <cstddef>
#include <span>

#include "proto/base/status.h"
#include "proto/discovery_message.h"

namespace pdr::proto {

// OK, or kMalformed "msgpack data is truncated: ..." naming the container that declared more than
// the bytes left could hold. Looks at the first msgpack object only (trailing bytes are
// unpack_bounded()'s to refuse).
Status check_declared_counts(std::span<const std::byte> bytes, const DecodeLimits& limits);

}  // namespace pdr::proto
