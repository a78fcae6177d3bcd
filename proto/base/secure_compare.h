// Constant-time comparison for secrets (discovery tokens, admin keys): the time taken depends only
// on the lengths, never on where the first differing byte is.
#pragma once

#include <cstddef>
#include <string_view>

namespace pdr {

inline bool secure_equals(std::string_view a, std::string_view b) {
  // Compare over the longer length so a short guess learns nothing but its own length mismatch.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace pdr
