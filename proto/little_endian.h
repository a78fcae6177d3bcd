// Little-endian integers in wire codecs, byte by byte (no struct memcpy, so no alignment or host
// byte-order assumptions), shared by every binary codec: transfer frames, the RDMA handshake, the
// shm control messages, the RDMA notify messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pdr::proto {

template <typename T>
void put_le(std::byte* out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<std::byte>(static_cast<std::uint64_t>(value) >> (8 * i) & 0xff);
  }
}

template <typename T>
void append_le(std::string* out, T value) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out->push_back(static_cast<char>(static_cast<std::uint64_t>(value) >> (8 * i) & 0xff));
  }
}

template <typename T>
T get_le(const std::byte* in) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<std::uint64_t>(std::to_integer<std::uint8_t>(in[i])) << (8 * i);
  }
  return static_cast<T>(value);
}

// "0x5850": magic numbers in error messages.
inline std::string hex16(std::uint16_t value) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "0x";
  for (int shift = 12; shift >= 0; shift -= 4) out.push_back(kHex[(value >> shift) & 0xf]);
  return out;
}

}  // namespace pdr::proto
