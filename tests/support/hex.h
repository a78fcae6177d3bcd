// Hex dumps for byte-exact codec tests (lowercase, no separators).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace pdr::test {

inline std::string from_hex(std::string_view hex) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(nibble(hex[i]) * 16 + nibble(hex[i + 1])));
  }
  return out;
}

inline std::string to_hex(std::span<const std::byte> bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::byte b : bytes) {
    const auto u = static_cast<unsigned char>(b);
    out.push_back(kHex[u >> 4]);
    out.push_back(kHex[u & 0xf]);
  }
  return out;
}

inline std::string to_hex(std::string_view bytes) {
  return to_hex(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
}

}  // namespace pdr::test
