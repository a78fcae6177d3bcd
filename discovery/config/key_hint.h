// "Did you mean" hints for unknown keys, shared by every strict reader of operator input (the
// topology file's YAML, the admin API's JSON bodies). Pure text; no parser types.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace pdr::config {

// Levenshtein distance between `a` and `b`.
size_t edit_distance(std::string_view a, std::string_view b);
// "did you mean 'k'?" for a key within two edits of a known one, else "expected one of: a, b".
std::string unknown_key_hint(std::string_view key, const std::vector<std::string_view>& known);

}  // namespace pdr::config
