#include "proto/sse_boundary.h"

namespace pdr::proto {

size_t SseBoundaryScanner::scan(std::string_view buffer) {
  size_t i = pos_;
  const size_t n = buffer.size();
  while (i < n) {
    const char c = buffer[i];
    if (c == '\r' || c == '\n') {
      if (c == '\r' && i + 1 == n) break;  // "\r" or "\r\n": decided by the next byte
      i += (c == '\r' && buffer[i + 1] == '\n') ? 2 : 1;
      if (line_empty_) last_end_ = i;  // a blank line: the event ends here
      line_empty_ = true;
    } else {
      line_empty_ = false;
      ++i;
    }
  }
  pos_ = i;
  return last_end_;
}

void SseBoundaryScanner::consumed(size_t n) {
  if (n > pos_) {
    // Only a pending final "\r" can be dropped unscanned (a forced flush): it ended a line.
    pos_ = 0;
    line_empty_ = true;
  } else {
    pos_ -= n;
  }
  last_end_ = last_end_ > n ? last_end_ - n : 0;
}

bool sse_has_data_field(std::string_view events) {
  size_t at = 0;
  while (at < events.size()) {
    if (events.substr(at, 4) == "data") {
      const char next = at + 4 < events.size() ? events[at + 4] : '\n';
      if (next == ':' || next == '\r' || next == '\n') return true;
    }
    // A plain loop: find_first_of calls memchr over its needle once per byte.
    while (at < events.size() && events[at] != '\r' && events[at] != '\n') ++at;
    if (at == events.size()) return false;
    ++at;
  }
  return false;
}

}  // namespace pdr::proto
