// Token usage in a node's answer, found without parsing the answer: the "usage" objects of an
// OpenAI completion or chat answer or stream chunk (prompt_tokens, completion_tokens), of a
// Responses API answer or event and of an Anthropic message or stream event (input_tokens,
// output_tokens). scan_usage() looks for the key "usage" followed by an object anywhere in the
// bytes it is given (a JSON answer, or whole SSE events), reads those top-level integer fields of
// each such object, and lets later objects override earlier fields (a stream's last usage is its
// total; Anthropic's message_start carries input_tokens and message_delta the final
// output_tokens). "usage": null and objects larger than kMaxUsageObjectBytes (or cut off by the
// end of the bytes) are skipped. A quote inside a JSON string is always escaped, so generated
// text can never read as the key. Pure; no allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace pdr::proto {

inline constexpr size_t kMaxUsageObjectBytes = 4096;

struct TokenUsage {
  std::optional<uint64_t> prompt_tokens;  // prompt_tokens or input_tokens
  std::optional<uint64_t> output_tokens;  // completion_tokens or output_tokens
};

void scan_usage(std::string_view bytes, TokenUsage* usage);

}  // namespace pdr::proto
