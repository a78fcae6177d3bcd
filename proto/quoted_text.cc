#include "proto/quoted_text.h"

namespace pdr::proto {

namespace {

bool is_plain_printable(unsigned char c) { return c >= 0x20 && c < 0x7f && c != '\'' && c != '\\'; }

void append_hex_escape(unsigned char c, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->append("\\x");
  out->push_back(kHex[c >> 4]);
  out->push_back(kHex[c & 0xf]);
}

}  // namespace

std::string quote_untrusted(std::string_view text, size_t max_chars) {
  const bool truncated = text.size() > max_chars;
  const std::string_view shown = truncated ? text.substr(0, max_chars) : text;
  std::string out;
  out.reserve(shown.size() + 5);
  out.push_back('\'');
  for (char ch : shown) {
    const auto c = static_cast<unsigned char>(ch);
    if (is_plain_printable(c)) {
      out.push_back(ch);
    } else {
      append_hex_escape(c, &out);
    }
  }
  if (truncated) out.append("...");
  out.push_back('\'');
  return out;
}

}  // namespace pdr::proto
