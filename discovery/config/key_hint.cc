#include "discovery/config/key_hint.h"

#include <fmt/format.h>

#include <algorithm>

namespace pdr::config {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string unknown_key_hint(std::string_view key, const std::vector<std::string_view>& known) {
  std::string_view best;
  size_t best_distance = 3;  // typos of one or two characters get a suggestion
  for (std::string_view k : known) {
    size_t d = edit_distance(key, k);
    if (d < best_distance) {
      best_distance = d;
      best = k;
    }
  }
  if (!best.empty()) return fmt::format("did you mean '{}'?", best);
  return fmt::format("expected one of: {}", fmt::join(known, ", "));
}

}  // namespace pdr::config
