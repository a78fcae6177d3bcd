// XXH64 follows the reference description (github.com/Cyan4973/xxHash, doc/xxhash_spec.md);
// tests/router/policies_test.cc checks it against the reference sanity vectors.
#include <algorithm>
#include <bit>
#include <cstring>

#include "router/policies/policy.h"

namespace pdr::router {
namespace {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ULL;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ULL;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ULL;

// XXH64 is defined over little-endian reads.
uint64_t read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

uint64_t read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}

uint64_t xxh_round(uint64_t acc, uint64_t lane) {
  acc += lane * kPrime2;
  acc = std::rotl(acc, 31);
  return acc * kPrime1;
}

uint64_t merge_round(uint64_t acc, uint64_t lane) {
  acc ^= xxh_round(0, lane);
  return acc * kPrime1 + kPrime4;
}

}  // namespace

uint64_t affinity_hash(std::string_view bytes, uint64_t seed) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t len = bytes.size();
  const unsigned char* const end = p + len;
  uint64_t h;
  if (len >= 32) {
    uint64_t v1 = seed + kPrime1 + kPrime2;
    uint64_t v2 = seed + kPrime2;
    uint64_t v3 = seed;
    uint64_t v4 = seed - kPrime1;
    const unsigned char* const limit = end - 32;
    do {
      v1 = xxh_round(v1, read64(p));
      v2 = xxh_round(v2, read64(p + 8));
      v3 = xxh_round(v3, read64(p + 16));
      v4 = xxh_round(v4, read64(p + 24));
      p += 32;
    } while (p <= limit);
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = merge_round(h, v1);
    h = merge_round(h, v2);
    h = merge_round(h, v3);
    h = merge_round(h, v4);
  } else {
    h = seed + kPrime5;
  }
  h += static_cast<uint64_t>(len);
  for (; end - p >= 8; p += 8) {
    h ^= xxh_round(0, read64(p));
    h = std::rotl(h, 27) * kPrime1 + kPrime4;
  }
  if (end - p >= 4) {
    h ^= read32(p) * kPrime1;
    h = std::rotl(h, 23) * kPrime2 + kPrime3;
    p += 4;
  }
  for (; p < end; ++p) {
    h ^= *p * kPrime5;
    h = std::rotl(h, 11) * kPrime1;
  }
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

RequestSummary affinity_from_header(std::string_view header_value) {
  if (header_value.empty()) return {};
  return {affinity_hash(header_value), true};
}

RequestSummary affinity_from_session(std::string_view conversation_id, std::string_view user) {
  if (!conversation_id.empty()) return {affinity_hash(conversation_id), true};
  if (!user.empty()) return {affinity_hash(user), true};
  return {};
}

RequestSummary affinity_from_prompt_prefix(std::string_view prompt, uint32_t prefix_bytes) {
  const std::string_view prefix = prompt.substr(0, std::min<size_t>(prefix_bytes, prompt.size()));
  if (prefix.empty()) return {};
  return {affinity_hash(prefix), true};
}

RequestSummary summarize_affinity(const AffinityInputs& inputs, uint32_t prefix_bytes) {
  if (RequestSummary s = affinity_from_header(inputs.header_value); s.has_affinity) return s;
  if (RequestSummary s = affinity_from_session(inputs.conversation_id, inputs.user); s.has_affinity)
    return s;
  return affinity_from_prompt_prefix(inputs.prompt, prefix_bytes);
}

}  // namespace pdr::router
