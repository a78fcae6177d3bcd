// Fuzzes proto/mooncake_query: a bootstrap server's /query answer is untrusted bytes from the
// network. Property: no crash; on success the ranks are dense and at most 4096.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "proto/mooncake_query.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pdr::proto::MooncakeEngines engines;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (pdr::proto::parse_mooncake_query(text, &engines).is_ok()) {
    if (engines.engine_ids.empty() || engines.engine_ids.size() > 4096) std::abort();
  }
  return 0;
}
