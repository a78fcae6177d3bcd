#include "tests/support/source_path.h"

namespace pdr::test {

// PDR_SOURCE_DIR is defined for this file alone (tests/CMakeLists.txt): an absolute path on every
// test's command line would make each compile differ between checkouts, and ccache could not
// reuse one checkout's objects in another.
std::string source_path(const std::string& relative) { return std::string(PDR_SOURCE_DIR) + "/" + relative; }

}  // namespace pdr::test
