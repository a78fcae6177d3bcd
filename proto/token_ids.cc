#include "proto/token_ids.h"

namespace pdr::proto {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

bool parse_token_id_array(std::string_view raw, size_t max_tokens, std::vector<uint32_t>* out) {
  out->clear();
  size_t i = 0;
  auto skip_space = [&] {
    while (i < raw.size() && is_space(raw[i])) ++i;
  };
  skip_space();
  if (i == raw.size() || raw[i] != '[') return false;
  ++i;
  skip_space();
  if (i < raw.size() && raw[i] == ']') return false;  // empty: no prompt to match
  while (true) {
    skip_space();
    // JSON integers: no leading '+', no leading zeros beyond "0"; '-' means not a token id.
    if (i == raw.size() || raw[i] < '0' || raw[i] > '9') return false;
    uint64_t value = 0;
    const size_t start = i;
    while (i < raw.size() && raw[i] >= '0' && raw[i] <= '9') {
      value = value * 10 + static_cast<uint64_t>(raw[i] - '0');
      if (value > UINT32_MAX) return false;
      ++i;
    }
    if (raw[start] == '0' && i - start > 1) return false;
    if (i < raw.size() && (raw[i] == '.' || raw[i] == 'e' || raw[i] == 'E')) return false;
    if (out->size() == max_tokens) return false;
    out->push_back(static_cast<uint32_t>(value));
    skip_space();
    if (i == raw.size()) return false;
    if (raw[i] == ']') break;
    if (raw[i] != ',') return false;
    ++i;
  }
  ++i;
  skip_space();
  return i == raw.size();
}

}  // namespace pdr::proto
