// Files of the source tree the tests were built from (fuzz corpora, the example topology).
#pragma once

#include <string>

namespace pdr::test {

// `relative` (e.g. "deploy/topology.example.yaml") under the source root, as an absolute path.
std::string source_path(const std::string& relative);

}  // namespace pdr::test
