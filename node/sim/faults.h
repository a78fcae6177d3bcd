// Test-only fault injection for `pdnode sim` (POST /sim/faults, DELETE /sim/faults; see
// server.h). FaultSpec is one parsed fault, parse_fault() the pure parser of the POST body and
// FaultQueue the pending faults shared by the sim's workers.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace pdr::node::sim {

// What the sim does instead of (or before) answering a request normally.
struct FaultSpec {
  enum class Action {
    kNone,              // only a delay, then the normal answer
    kStatus,            // answer `status` with vLLM's error body
    kHang,              // never answer; the client's close is counted as an abort
    kCloseAfterTokens,  // stream: N token events then the connection is cut (no terminating chunk);
                        // non-stream: the connection is closed, unanswered, when the answer is due
    kCloseImmediately,  // close the connection, unanswered, as soon as the request arrives
    kStopAfterFirstToken,  // the answer ends after one token with finish_reason "stop" (EOS): a
                           // prefill leg then exports no KV (kv_transfer_params null), as vLLM's
                           // does when its one token is EOS
  };
  Action action = Action::kNone;
  int status = 0;                   // kStatus: 400..599
  uint32_t close_after_tokens = 0;  // kCloseAfterTokens
  uint32_t delay_ms = 0;            // before the first byte (or before the action); 0: none
  int64_t count = 1;                // matching requests it applies to; -1: until cleared
  std::optional<std::string> path;  // exact request path; none: the two generation endpoints

  bool matches(std::string_view request_path) const;
  // The fault as a JSON object, the way it was given (without count): what GET /sim/requests
  // shows in an entry's "fault" field, e.g. {"status":500,"delay_ms":20}.
  std::string to_json() const;
};

// Parses the body of POST /sim/faults: a JSON object with exactly one of "status", "hang",
// "close_after_tokens", "close_immediately", "stop_after_first_token", and/or "delay_ms" (at least
// one of the six), plus optional "count" and "path". Unknown keys, wrong types and out-of-range values are refused.
// Returns a message for a 400 answer, or nothing and fills `*out`.
std::optional<std::string> parse_fault(std::string_view body, FaultSpec* out);

// Pending faults, in the order they were queued. Thread-safe (one mutex): any worker takes.
class FaultQueue {
 public:
  void push(FaultSpec fault);
  void clear();
  size_t size() const;
  // The first queued fault that matches `request_path`, consuming one of its uses (a fault whose
  // uses are spent leaves the queue). Nothing if no queued fault matches.
  std::optional<FaultSpec> take(std::string_view request_path);
  // {"faults":[{...,"count":N},...]}: what is still queued, with the uses left.
  std::string to_json() const;

 private:
  mutable std::mutex mutex_;
  std::deque<FaultSpec> faults_;
};

}  // namespace pdr::node::sim
