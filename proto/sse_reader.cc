#include "proto/sse_reader.h"

#include <cstring>

namespace pdr::proto {
namespace {

constexpr std::string_view kBom = "\xEF\xBB\xBF";

// Finds line ends in one feed. The next '\n' is remembered rather than searched for again at each
// line: a body of "\r"-only line endings would otherwise make each line's search scan to the
// next '\n' (or the end of the feed), quadratic in the feed size.
class LineEnds {
 public:
  explicit LineEnds(std::string_view s) : s_(s) {}

  // Offset (into the feed) of the first '\r' or '\n' at or after `from`, or npos.
  size_t next(size_t from) {
    if (!searched_ || lf_ < from) {
      const void* lf = std::memchr(s_.data() + from, '\n', s_.size() - from);
      lf_ = lf ? static_cast<size_t>(static_cast<const char*>(lf) - s_.data()) : s_.size();
      searched_ = true;
    }
    const void* cr = std::memchr(s_.data() + from, '\r', lf_ - from);
    if (cr) return static_cast<size_t>(static_cast<const char*>(cr) - s_.data());
    return lf_ < s_.size() ? lf_ : std::string_view::npos;
  }

 private:
  std::string_view s_;
  size_t lf_ = 0;  // the first '\n' at or after the last search's start, or s_.size() if none
  bool searched_ = false;
};

}  // namespace

SseReader::SseReader(size_t max_event_bytes) : max_event_bytes_(max_event_bytes) {}

size_t SseReader::pending_bytes() const {
  const size_t bom = bom_done_ ? 0 : bom_matched_;
  return bom + line_.size() + data_.size() + event_type_.size();
}

Status SseReader::fail() {
  failed_ = Status(StatusCode::kTooLarge, "server-sent event over the " +
                                              std::to_string(max_event_bytes_) + "-byte limit");
  // Nothing more will be read, so give the memory back now rather than when the reader dies.
  std::string().swap(line_);
  std::string().swap(data_);
  std::string().swap(event_type_);
  std::string().swap(last_id_);
  return failed_;
}

Status SseReader::feed(std::string_view bytes, const std::function<void(const SseEvent&)>& on_event) {
  if (!failed_.is_ok()) return failed_;
  // The BOM may itself arrive split across feeds, so it is matched byte by byte; on a mismatch the
  // bytes held back were ordinary text and go through the line reader like any other.
  while (!bom_done_ && !bytes.empty()) {
    if (bytes.front() == kBom[bom_matched_]) {
      bytes.remove_prefix(1);
      if (++bom_matched_ == kBom.size()) bom_done_ = true;
      continue;
    }
    bom_done_ = true;
    if (bom_matched_ > 0) {
      if (Status st = consume(kBom.substr(0, bom_matched_), on_event); !st.is_ok()) return st;
    }
  }
  if (bytes.empty()) return Status::ok();
  return consume(bytes, on_event);
}

Status SseReader::consume(std::string_view bytes, const std::function<void(const SseEvent&)>& on_event) {
  if (skip_lf_ && !bytes.empty()) {
    skip_lf_ = false;
    if (bytes.front() == '\n') bytes.remove_prefix(1);
  }
  LineEnds ends(bytes);
  size_t pos = 0;
  while (pos < bytes.size()) {
    const size_t end = ends.next(pos);
    // The limit counts the whole current line, so a line split across feeds trips it at the same
    // point in the stream as the line read in one piece (the status must not depend on splits).
    const size_t held = data_.size() + event_type_.size() + line_.size();
    if (end == std::string_view::npos) {
      if (held + (bytes.size() - pos) > max_event_bytes_) return fail();
      line_.append(bytes.substr(pos));
      return Status::ok();
    }
    if (held + (end - pos) > max_event_bytes_) return fail();
    std::string_view line = bytes.substr(pos, end - pos);
    if (!line_.empty()) {
      line_.append(line);
      line = line_;
    }
    pos = end + 1;
    if (bytes[end] == '\r') {
      if (pos == bytes.size()) {
        skip_lf_ = true;
      } else if (bytes[pos] == '\n') {
        ++pos;
      }
    }
    process_line(line, on_event);
    line_.clear();
  }
  return Status::ok();
}

void SseReader::process_line(std::string_view line, const std::function<void(const SseEvent&)>& on_event) {
  if (line.empty()) {
    dispatch(on_event);
    return;
  }
  if (line.front() == ':') return;
  std::string_view field = line;
  std::string_view value;
  if (const size_t colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    data_.append(value);
    data_.push_back('\n');
  } else if (field == "event") {
    event_type_.assign(value);
  } else if (field == "id") {
    if (value.find('\0') == std::string_view::npos) last_id_.assign(value);
  }
  // "retry" only matters to a reconnecting EventSource; a benchmark client never reconnects.
}

void SseReader::dispatch(const std::function<void(const SseEvent&)>& on_event) {
  if (!data_.empty()) {
    SseEvent event;
    event.event = event_type_;
    event.data = std::string_view(data_).substr(0, data_.size() - 1);
    event.id = last_id_;
    ++events_;
    on_event(event);
  }
  // clear() keeps the capacity, so a steady stream of similar events allocates nothing.
  data_.clear();
  event_type_.clear();
}

}  // namespace pdr::proto
