// Prompt token counts (contracts in prompt_tokens.h).
#include "router/policies/prompt_tokens.h"

#include <algorithm>

namespace pdr::router {

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// Elements of a flat JSON array of integers, or 0 when `raw` is anything else (text, a chat
// messages array, nested arrays of a batch).
uint64_t integer_array_size(std::string_view raw) {
  size_t i = 0;
  while (i < raw.size() && is_space(raw[i])) ++i;
  if (i == raw.size() || raw[i] != '[') return 0;
  uint64_t elements = 0;
  bool in_number = false;
  for (++i; i < raw.size(); ++i) {
    const char c = raw[i];
    if (c >= '0' && c <= '9') {
      if (!in_number) ++elements;
      in_number = true;
    } else if (c == ',' || is_space(c)) {
      in_number = false;
    } else if (c == ']') {
      return elements;
    } else {
      return 0;  // a string, an object, a nested array, a sign or a fraction: not token ids
    }
  }
  return 0;
}

}  // namespace

PromptTokens count_prompt_tokens(std::string_view raw_prompt) {
  PromptTokens out;
  out.bytes = raw_prompt.size();
  if (raw_prompt.empty() || raw_prompt == "null") return out;
  if (const uint64_t ids = integer_array_size(raw_prompt); ids != 0) {
    out.count = ids;
    out.source = PromptTokens::Source::kTokenIds;
    return out;
  }
  out.count = std::max<uint64_t>(1, raw_prompt.size() / 4);
  return out;
}

uint64_t uncached_tokens(const PromptTokens& prompt, const CacheHits* hits, std::string_view node_key) {
  if (hits == nullptr || prompt.count == 0) return prompt.count;
  const uint64_t matched = hits->matched(node_key);
  if (matched == 0) return prompt.count;
  uint64_t cached = matched;
  if (hits->source == CacheHits::Source::kPrefixTree) {
    // Bytes of the prompt's text: the same share of its tokens.
    cached = prompt.bytes == 0 ? 0 : matched * prompt.count / prompt.bytes;
  }
  return prompt.count - std::min(cached, prompt.count);
}

}  // namespace pdr::router
