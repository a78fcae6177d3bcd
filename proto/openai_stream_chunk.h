// One SSE data payload of a streamed OpenAI response (/v1/completions or /v1/chat/completions, as
// vLLM and pdrouter send them), reduced to what a load-benchmark client measures: how much text
// arrived, token usage, the finish reason, or an error. Also the error body of a non-2xx answer.
// Pure; no I/O.
//
// Contract:
//   - parse_stream_chunk() takes the data of one event (SseEvent::data). "[DONE]" (surrounding
//     whitespace allowed) sets `done` and nothing else. Otherwise the payload must be one JSON
//     object (at most 4 MiB, nesting at most 64 deep). Unknown keys are ignored.
//   - Error chunks: {"error": {"message": "..."}} (OpenAI, pdrouter, newer vLLM) or
//     {"object": "error", "message": "..."} (older vLLM). Either sets error_message and nothing
//     else is read. An "error" value without a string message (e.g. {"error": "text"} or
//     {"error": {"code": 500}}) still marks an error: its text, or its JSON, is the message.
//     Messages are capped at kMaxErrorMessageBytes, cut at a UTF-8 boundary and ending in "...".
//   - Errors: kTooLarge (over 4 MiB), kTooDeep, kMalformed ("stream chunk: invalid JSON at
//     byte N: <what>", N 0-based), kWrongType (not an object; choices not an array; a choice,
//     delta or usage not an object; text, content, reasoning_content or finish_reason not a
//     string; a token count not an integer), kOutOfRange (a negative token count). The message
//     names the field, e.g. "choices[0].delta.content". null counts as absent for every field
//     read. `out` is untouched on error.
//   - Thread-safe (each thread reuses its own parser).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "proto/base/status.h"

namespace pdr::proto {

struct StreamChunk {
  bool done = false;  // the payload was "[DONE]"
  // Bytes of generated text in this chunk: choices[*].text (completions) plus
  // choices[*].delta.content and delta.reasoning_content (chat; vLLM's newer delta.reasoning is
  // read when reasoning_content is absent). Absent or null counts 0.
  size_t content_bytes = 0;
  uint32_t choices_with_content = 0;  // choices that contributed at least one byte above
  // From "usage" when it is an object ("usage": null, common on vLLM's per-token chunks, and an
  // absent "usage" both leave these empty).
  std::optional<uint64_t> prompt_tokens;
  std::optional<uint64_t> completion_tokens;
  std::optional<std::string> finish_reason;  // the first non-null choices[*].finish_reason
  std::optional<std::string> error_message;  // set when the chunk is an error
};

inline constexpr size_t kMaxStreamChunkBytes = 4u << 20;
inline constexpr size_t kMaxErrorMessageBytes = 1024;

Status parse_stream_chunk(std::string_view data, StreamChunk* out);

// For the body of a non-2xx HTTP answer: the error's message when the body is a JSON object of
// either error shape above (capped the same way), else nullopt (not JSON, over 4 MiB, or JSON that
// is not an error).
std::optional<std::string> error_message_of(std::string_view body);

}  // namespace pdr::proto
