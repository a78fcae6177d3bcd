#include "node/sim_kv_content.h"

#include <cstring>

namespace pdr::node::sim {
namespace {

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t block_state(uint64_t seed, uint32_t block, uint32_t layer) {
  uint64_t state = seed ^ ((uint64_t{block} << 32) | layer) * 0xd6e8feb86659fd93ULL;
  splitmix64(&state);  // decorrelate neighbouring (block, layer) pairs
  return state;
}

// Produces the next up-to-8 bytes of the stream into `word`.
void next_word(uint64_t* state, unsigned char word[8]) {
  const uint64_t value = splitmix64(state);
  for (int i = 0; i < 8; ++i) word[i] = static_cast<unsigned char>(value >> (8 * i));
}

}  // namespace

uint64_t kv_content_seed(std::string_view transfer_key, std::string_view prompt) {
  uint64_t hash = 1469598103934665603ULL;
  auto mix = [&hash](std::string_view text) {
    for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ULL;
  };
  mix(transfer_key);
  hash = (hash ^ 0xff) * 1099511628211ULL;  // "ab"+"c" and "a"+"bc" differ
  mix(prompt);
  uint64_t state = hash;
  return splitmix64(&state);
}

void fill_kv_block(uint64_t seed, uint32_t block, uint32_t layer, std::span<std::byte> out) {
  uint64_t state = block_state(seed, block, layer);
  unsigned char word[8];
  size_t i = 0;
  for (; i + 8 <= out.size(); i += 8) {
    next_word(&state, word);
    std::memcpy(out.data() + i, word, 8);
  }
  if (i < out.size()) {
    next_word(&state, word);
    std::memcpy(out.data() + i, word, out.size() - i);
  }
}

std::optional<size_t> check_kv_block(uint64_t seed, uint32_t block, uint32_t layer,
                                     std::span<const std::byte> got) {
  uint64_t state = block_state(seed, block, layer);
  unsigned char word[8];
  for (size_t i = 0; i < got.size(); i += 8) {
    next_word(&state, word);
    const size_t n = std::min<size_t>(8, got.size() - i);
    if (std::memcmp(got.data() + i, word, n) != 0) {
      for (size_t j = 0; j < n; ++j) {
        if (got[i + j] != static_cast<std::byte>(word[j])) return i + j;
      }
    }
  }
  return std::nullopt;
}

}  // namespace pdr::node::sim
