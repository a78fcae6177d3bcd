// The SSE event-boundary rule of proto/sse_boundary.h read byte by byte: the offset just past the
// last blank line among complete line endings ("\r\n", "\n" or "\r"; a final "\r" is undecided).
// The oracle the unit test and the sse_reader fuzzer compare SseBoundaryScanner (which skips line
// text a word at a time) against. Header-only: the fuzzers link only the library they fuzz.
#pragma once

#include <cstddef>
#include <string_view>

namespace pdr::test {

inline size_t sse_boundary_reference(std::string_view body) {
  size_t last = 0;
  bool empty = false;  // a line ending was just seen
  for (size_t i = 0; i < body.size();) {
    const char c = body[i];
    if (c == '\r' || c == '\n') {
      if (c == '\r' && i + 1 == body.size()) break;
      i += (c == '\r' && body[i + 1] == '\n') ? 2 : 1;
      if (empty) last = i;
      empty = true;
    } else {
      empty = false;
      ++i;
    }
  }
  return last;
}

}  // namespace pdr::test
