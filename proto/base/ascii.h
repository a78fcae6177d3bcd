// ASCII helpers for protocol text (header names, URL schemes): locale-free on purpose, since
// these comparisons must not change with the process locale.
#pragma once

#include <cstddef>
#include <string_view>

namespace pdr {

constexpr char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// Case-insensitive equality over ASCII letters; other bytes compare exactly.
constexpr bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

// True if `s` holds an ASCII control character (below 0x20, or DEL): operator-supplied names and
// addresses must not carry them into logs or terminals.
constexpr bool has_control_chars(std::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return true;
  }
  return false;
}

}  // namespace pdr
