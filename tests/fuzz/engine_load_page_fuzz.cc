// Fuzzes proto/engine_load_page: a node's /metrics page is untrusted bytes (the periodic load
// scrape, router/proxy/engine_load_scrape.h). Properties: no crash or sanitizer report; an ok
// page has KV usage within [0, 1] or negative (absent), never more ranks than max_ranks, and the
// node's running count at least every rank's.
// Input layout: the page as it is.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "proto/engine_load_page.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  pdr::proto::EngineLoadPageLimits limits;
  limits.lines.max_lines = 64;
  limits.max_ranks = 8;
  const pdr::proto::EngineLoadPage page = pdr::proto::read_engine_load_page(text, limits);
  if (page.outcome != pdr::proto::EngineLoadPage::Outcome::kOk) {
    if (!page.ranks.empty()) std::abort();
    return 0;
  }
  if (page.ranks.size() > limits.max_ranks) std::abort();
  if (page.node.kv_cache_usage > 1.0) std::abort();
  for (const auto& rank : page.ranks) {
    if (rank.kv_cache_usage > 1.0 || rank.running > page.node.running || rank.waiting > page.node.waiting) {
      std::abort();
    }
  }
  return 0;
}
