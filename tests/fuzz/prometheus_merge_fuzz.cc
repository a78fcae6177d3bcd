// Fuzzes proto/prometheus_merge: a node's /metrics page is untrusted bytes (GET /engine_metrics).
// Properties: no crash or sanitizer report; small limits are never exceeded; every line of the
// merged page is a HELP/TYPE line or a sample starting with a valid metric name and carrying
// pdrouter's labels first.
// Input layout: the page as it is.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "proto/prometheus_merge.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view page(reinterpret_cast<const char*>(data), size);
  pdr::proto::PromMergeLimits limits;
  limits.max_lines = 64;
  limits.max_samples = 48;
  limits.max_labels = 4;
  limits.max_label_value_bytes = 32;
  pdr::proto::PromMerger merger(limits);
  const auto a = merger.add(page, {{"pdrouter_node", "127.0.0.1:1"}, {"pdrouter_role", "decode"}});
  const auto b = merger.add(page, {{"pdrouter_node", "127.0.0.1:2"}, {"pdrouter_role", "prefill"}});
  if (a.samples + b.samples > limits.max_samples) std::abort();
  const std::string out = merger.render();
  std::string_view rest = out;
  while (!rest.empty()) {
    const size_t eol = rest.find('\n');
    if (eol == std::string_view::npos) std::abort();  // every line ends with \n
    const std::string_view line = rest.substr(0, eol);
    rest.remove_prefix(eol + 1);
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) continue;
    if (line.find("{pdrouter_node=\"127.0.0.1:") == std::string_view::npos) std::abort();
    const char c = line.empty() ? '0' : line.front();
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':')) std::abort();
  }
  return 0;
}
