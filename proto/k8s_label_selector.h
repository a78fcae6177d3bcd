// Kubernetes label selectors (the `labelSelector` query parameter of a list or watch, as
// `kubectl get -l` takes it), parsed and matched locally. Pure: no I/O.
//
// Syntax (comma = AND; spaces around words and operators are allowed):
//   key            the pod has the label          !key           it does not
//   key=value      key==value                     key!=value     (true too when key is absent)
//   key in (v1,v2) key notin (v1,v2)              (notin is true too when key is absent)
// Keys are qualified names: an optional DNS-subdomain prefix (at most 253 bytes) and '/', then
// a name of 1 to 63 bytes, [A-Za-z0-9] at both ends and [-_.A-Za-z0-9] inside. Values: 0 to 63
// bytes of the same characters. The comparison operators `gt` / `lt` (> <) are not supported.
// An empty selector matches every pod.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "proto/base/status.h"
#include "proto/k8s_pods.h"

namespace pdr::proto {

inline constexpr size_t kMaxLabelSelectorBytes = 1024;

enum class LabelOp : unsigned char { kExists, kNotExists, kEquals, kNotEquals, kIn, kNotIn };

struct LabelRequirement {
  std::string key;
  LabelOp op = LabelOp::kExists;
  std::vector<std::string> values;  // kEquals/kNotEquals: one; kIn/kNotIn: at least one
  bool operator==(const LabelRequirement&) const = default;
};

struct LabelSelector {
  std::string text;  // as written
  std::vector<LabelRequirement> requirements;
  bool operator==(const LabelSelector&) const = default;
};

// Errors: kInvalidValue with what is wrong and the byte offset ("at 7: expected ')'"),
// kTooLarge over kMaxLabelSelectorBytes. `out` is untouched on error.
Status parse_label_selector(std::string_view text, LabelSelector* out);

// Whether a pod with these labels matches every requirement.
bool label_selector_matches(const LabelSelector& selector, const PodMetadataMap& labels);

}  // namespace pdr::proto
