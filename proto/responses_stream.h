// How pdrouter ends a streamed POST /v1/responses answer that fails after the client's stream
// began (the decode died, went silent, or timeouts.request_ms passed).
//
// vLLM's Responses stream (vllm/entrypoints/openai/responses/api_router.py, serving.py) is named
// SSE events, "event: <type>\ndata: <json with the same type and a sequence_number>\n\n",
// numbered from 0 (response.created, response.in_progress, ...), ended by response.completed,
// with no "data: [DONE]". A chat-style error (a bare data event, then [DONE]) is not an event a
// Responses client reads. So the failure is written as the Responses API's own events (OpenAI's
// openai.types.responses: ResponseErrorEvent, ResponseFailedEvent), continuing the numbering:
//
//   event: error
//   data: {"type":"error","code":<pdrouter's code>,"message":...,"param":null,"sequence_number":N}
//
//   event: response.failed
//   data: {"type":"response.failed","sequence_number":N+1,"response":{"id":<the stream's>,
//          "object":"response","status":"failed","error":{"code":"server_error","message":...}}}
//
// and no [DONE]. ResponsesStreamFollower learns N and the response id from the events relayed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace pdr::proto {

// Follows a relayed Responses stream: the sequence number the next event must take and the
// response's id (from the response.created event). Input is the node's untrusted bytes: a
// number or id that does not look like one (over 15 digits; an id over kMaxResponseId bytes or
// with characters outside [A-Za-z0-9_.:-]) is ignored.
class ResponsesStreamFollower {
 public:
  static constexpr size_t kMaxResponseId = 128;

  // `events`: whole events as they were relayed to the client, in order (a chunk may hold many).
  void observe(std::string_view events);

  // 0 until an event with a sequence_number was seen; then the last one + 1.
  int64_t next_sequence_number() const { return next_sequence_; }
  // "" until a response.created event named one.
  const std::string& response_id() const { return response_id_; }

 private:
  std::string response_id_;
  int64_t next_sequence_ = 0;
};

// The two failure events above (each ending with its blank line). `response_id` must be a
// plain id (ResponsesStreamFollower's, or one pdrouter made); `message` and `code` are escaped.
std::string responses_failure_events(std::string_view response_id, int64_t sequence_number,
                                     std::string_view message, std::string_view code);

}  // namespace pdr::proto
