// Fuzzes proto/k8s_label_selector: kubernetes.prefill_selector / decode_selector come from the
// topology file, untrusted bytes. Properties: no crash; a parsed selector has only valid keys
// (1..317 bytes) and values (0..63 bytes), a set operator at least one value, an equality
// operator exactly one; matching it against labels made of its own keys and values does not crash.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/k8s_label_selector.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdr::proto;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  LabelSelector selector;
  if (!parse_label_selector(text, &selector).is_ok()) return 0;
  if (selector.text != text) std::abort();
  PodMetadataMap labels;
  for (const LabelRequirement& r : selector.requirements) {
    if (r.key.empty() || r.key.size() > 317) std::abort();
    for (const auto& v : r.values) {
      if (v.size() > 63) std::abort();
    }
    switch (r.op) {
      case LabelOp::kExists:
      case LabelOp::kNotExists:
        if (!r.values.empty()) std::abort();
        break;
      case LabelOp::kEquals:
      case LabelOp::kNotEquals:
        if (r.values.size() != 1) std::abort();
        break;
      case LabelOp::kIn:
      case LabelOp::kNotIn:
        if (r.values.empty()) std::abort();
        break;
    }
    labels.emplace_back(r.key, r.values.empty() ? std::string() : r.values.front());
  }
  (void)label_selector_matches(selector, labels);
  (void)label_selector_matches(selector, {});
  return 0;
}
