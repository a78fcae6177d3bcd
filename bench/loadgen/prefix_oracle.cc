#include "bench/loadgen/prefix_oracle.h"

#include <string_view>

namespace pdr::loadgen {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

uint64_t hash_word(std::string_view word) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (const char c : word) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

std::vector<std::string_view> words_of(std::string_view text) {
  std::vector<std::string_view> words;
  size_t at = 0;
  while (at < text.size()) {
    const size_t start = text.find_first_not_of(" \t\r\n", at);
    if (start == std::string_view::npos) break;
    size_t end = text.find_first_of(" \t\r\n", start);
    if (end == std::string_view::npos) end = text.size();
    words.push_back(text.substr(start, end - start));
    at = end;
  }
  return words;
}

std::vector<uint64_t> prompt_token_keys(const BenchRequest& request, PromptFormat format) {
  std::vector<uint64_t> keys;
  if (format == PromptFormat::kTokenIds) {
    // Our own "[1,2,3]": digits and commas only.
    uint64_t value = 0;
    bool in_number = false;
    for (const char c : request.prompt_json) {
      if (c >= '0' && c <= '9') {
        value = value * 10 + static_cast<uint64_t>(c - '0');
        in_number = true;
      } else if (in_number) {
        keys.push_back(value);
        value = 0;
        in_number = false;
      }
    }
    return keys;
  }
  for (std::string_view word : words_of(request.prompt_text)) keys.push_back(hash_word(word));
  return keys;
}

uint64_t PrefixOracle::add(const std::vector<uint64_t>& tokens) {
  uint64_t chain = 0x6a09e667f3bcc908ULL;
  bool hitting = true;
  uint64_t hit = 0;
  const size_t full_blocks = tokens.size() / block_tokens_;
  for (size_t b = 0; b < full_blocks; ++b) {
    for (size_t t = b * block_tokens_; t < (b + 1) * block_tokens_; ++t) {
      chain = mix(chain ^ mix(tokens[t] + 0x9e3779b97f4a7c15ULL));
    }
    if (hitting && blocks_.contains(chain)) {
      hit += block_tokens_;
    } else {
      hitting = false;
      blocks_.insert(chain);
    }
  }
  prompt_tokens_ += tokens.size();
  hit_tokens_ += hit;
  return hit;
}

double PrefixOracle::hit_rate() const {
  return prompt_tokens_ == 0 ? 0.0 : static_cast<double>(hit_tokens_) / prompt_tokens_;
}

}  // namespace pdr::loadgen
