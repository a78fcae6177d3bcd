// SseBoundaryScanner: where complete events end in a text/event-stream body, for a relay that
// forwards whole events only (router/proxy/proxy_session.cc) without decoding them. The boundary
// rule is SseReader's (sse_reader.h): lines end in "\r\n", "\n" or "\r", and a blank line ends an
// event; so "\n\n", "\r\r", "\r\n\r\n" and mixes ("\n\r\n") all end one.
//
// Contract: the caller keeps one buffer of bytes not yet forwarded, appends to it and calls
// scan(buffer) after each append; scanning resumes where it stopped, so each byte is looked at
// once (a peer trickling bytes costs O(bytes), not O(bytes^2)). scan() returns the offset just
// past the last blank line seen in the buffer (0: none yet). A "\r" that is the buffer's last
// byte is left undecided until the next byte ("\r\n" is one line ending). After dropping the
// buffer's first n bytes, call consumed(n). Pure; not thread-safe.
#pragma once

#include <cstddef>
#include <string_view>

namespace pdr::proto {

class SseBoundaryScanner {
 public:
  size_t scan(std::string_view buffer);
  void consumed(size_t n);
  // The caller forwarded bytes that ended with a blank line without scanning them.
  void at_boundary() {
    pos_ = 0;
    last_end_ = 0;
    line_empty_ = true;
  }
  void reset() { *this = SseBoundaryScanner(); }

 private:
  size_t pos_ = 0;          // next byte of the buffer to look at
  size_t last_end_ = 0;     // just past the last blank line found (0: none)
  bool line_empty_ = false; // at the start of a line that follows a line ending
};

// True if the complete events in `events` carry a "data" field (not only comments or ids).
bool sse_has_data_field(std::string_view events);

}  // namespace pdr::proto
