// Incremental reader for a text/event-stream body (server-sent events, WHATWG HTML "event stream
// interpretation"), as vLLM and pdrouter send streamed OpenAI responses. Pure: the caller owns the
// socket and feeds whatever bytes arrived; no I/O, no threads.
//
// Contract:
//   - feed() accepts the body split at any byte; the events delivered and the final status do not
//     depend on where the splits fall.
//   - Lines end in "\r\n", "\n" or "\r" (a "\r" ending one feed and a "\n" starting the next
//     are one line ending). A UTF-8 BOM at the very start of the body is dropped. Lines starting
//     with ':' are comments. "field:value" drops one space after the ':'; a line without ':' is a
//     field with an empty value. "data" appends value + "\n" to the data buffer, "event" sets the
//     event type, "id" sets the last event id unless the value contains NUL; "retry" and unknown
//     fields are ignored.
//   - A blank line ends an event. It is delivered when its data buffer is non-empty, with the
//     buffer's final "\n" removed; either way data and event type are then reset, while the id
//     persists (per spec). An empty `event` means none was sent (browsers call that "message").
//   - on_event runs synchronously inside feed(); the views in SseEvent are valid only during that
//     call. It must not call feed() on the same reader.
//   - Size limit: the event type and data gathered so far plus the current line (field name and
//     value) must stay within max_event_bytes. Otherwise feed() returns kTooLarge naming the
//     limit, raised as soon as a buffered partial line crosses it, so memory stays within a small
//     multiple of max_event_bytes (the last event id is bounded by its line) even when a peer
//     never sends a line ending. The reader then stays failed: every later feed() returns that
//     same status without calling back, and its buffers are freed.
//   - Not thread-safe; one reader per response body.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "proto/base/status.h"

namespace pdr::proto {

struct SseEvent {
  std::string_view event;  // event type; empty when the event had no "event" field
  std::string_view data;   // data lines joined by "\n"
  std::string_view id;     // last event id seen on this stream (it persists across events)
};

class SseReader {
 public:
  static constexpr size_t kDefaultMaxEventBytes = 4u << 20;

  explicit SseReader(size_t max_event_bytes = kDefaultMaxEventBytes);

  // Consumes `bytes` and calls on_event for each event completed by them, in stream order.
  Status feed(std::string_view bytes, const std::function<void(const SseEvent&)>& on_event);

  // Bytes of an event begun but not ended: a partial line plus data and event type gathered
  // without a blank line yet. Non-zero once the body has ended means the stream was truncated.
  // Zero after a failure.
  size_t pending_bytes() const;
  // Events delivered so far.
  uint64_t events() const { return events_; }

 private:
  Status consume(std::string_view bytes, const std::function<void(const SseEvent&)>& on_event);
  void process_line(std::string_view line, const std::function<void(const SseEvent&)>& on_event);
  void dispatch(const std::function<void(const SseEvent&)>& on_event);
  Status fail();

  size_t max_event_bytes_;
  Status failed_;
  std::string line_;        // a line begun in an earlier feed, not yet ended
  std::string data_;        // data buffer: each data line's value followed by "\n"
  std::string event_type_;
  std::string last_id_;
  uint64_t events_ = 0;
  uint8_t bom_matched_ = 0;  // bytes of a leading BOM matched so far
  bool bom_done_ = false;    // the start of the body has been checked for a BOM
  bool skip_lf_ = false;     // the last feed ended in "\r": a "\n" starting the next is its partner
};

}  // namespace pdr::proto
