// Fuzzes proto/usage_scan: the bytes scanned are a node's answer, untrusted. Properties: no crash
// or read past the input (ASan); a field is set only when the input holds the key "usage", and
// only to a number written in the input under one of the token keys; scanning is deterministic.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/usage_scan.h"

namespace {

bool written_under(std::string_view bytes, uint64_t value, std::string_view key_a, std::string_view key_b) {
  const std::string digits = std::to_string(value);
  for (std::string_view key : {key_a, key_b}) {
    for (size_t at = bytes.find(key); at != std::string_view::npos; at = bytes.find(key, at + 1)) {
      const std::string_view rest = bytes.substr(at + key.size());
      const size_t value_at = rest.find_first_not_of(" \t\r\n:");
      if (value_at != std::string_view::npos && rest.substr(value_at).starts_with(digits)) return true;
    }
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  pdr::proto::TokenUsage usage;
  pdr::proto::scan_usage(bytes, &usage);
  if ((usage.prompt_tokens || usage.output_tokens) && bytes.find("\"usage\"") == std::string_view::npos) std::abort();
  if (usage.prompt_tokens &&
      !written_under(bytes, *usage.prompt_tokens, "\"prompt_tokens\"", "\"input_tokens\"")) {
    std::abort();
  }
  if (usage.output_tokens &&
      !written_under(bytes, *usage.output_tokens, "\"completion_tokens\"", "\"output_tokens\"")) {
    std::abort();
  }
  pdr::proto::TokenUsage again;
  pdr::proto::scan_usage(bytes, &again);
  if (again.prompt_tokens != usage.prompt_tokens || again.output_tokens != usage.output_tokens) std::abort();
  return 0;
}
