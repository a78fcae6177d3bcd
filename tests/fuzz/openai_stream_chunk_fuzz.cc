// Fuzzes proto/openai_stream_chunk: SSE data payloads and error bodies are untrusted bytes from an
// engine or a proxy. Property: no crash; on success the text counted is no longer than the input
// (unescaping only shrinks strings), a [DONE] chunk carries nothing else, and error messages stay
// within their cap.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "proto/openai_stream_chunk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  pdr::proto::StreamChunk chunk;
  if (pdr::proto::parse_stream_chunk(text, &chunk).is_ok()) {
    if (chunk.content_bytes > size) std::abort();
    if (chunk.choices_with_content > size) std::abort();
    if (chunk.done && (chunk.content_bytes != 0 || chunk.error_message || chunk.finish_reason)) {
      std::abort();
    }
    if (chunk.error_message && chunk.error_message->size() > pdr::proto::kMaxErrorMessageBytes) {
      std::abort();
    }
  }
  const std::optional<std::string> message = pdr::proto::error_message_of(text);
  if (message && message->size() > pdr::proto::kMaxErrorMessageBytes) std::abort();
  // A body that error_message_of calls an error parses as an error chunk with the same message.
  if (message) {
    pdr::proto::StreamChunk as_chunk;
    if (!pdr::proto::parse_stream_chunk(text, &as_chunk).is_ok()) std::abort();
    if (as_chunk.error_message != message) std::abort();
  }
  return 0;
}
