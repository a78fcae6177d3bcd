// Fuzzes bench/loadgen/trace_workload: a request trace is a file a user downloads, untrusted bytes.
// Property: no crash; on success every entry passed the checks the replay relies on (lengths in
// range, no more hash ids than blocks, timestamps finite, >= 0 and in order), and the prompts
// built from them are exactly input_length ids in the vocabulary.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "bench/loadgen/trace_workload.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdr::loadgen;
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  // Small limits keep each run fast; the checks are the same at any size.
  const TraceReadOptions options{.block_tokens = 16,
                                 .limits = {.max_line_bytes = 4096, .max_entries = 64,
                                            .max_input_length = 2048, .max_output_length = 2048,
                                            .max_total_input_tokens = 8192}};
  std::vector<TraceEntry> entries;
  if (!read_trace(in, "fuzz", options, &entries).is_ok()) return 0;
  if (entries.empty() || entries.size() > 64) std::abort();
  double previous = 0;
  for (const TraceEntry& e : entries) {
    if (!std::isfinite(e.timestamp_ms) || e.timestamp_ms < previous) std::abort();
    previous = e.timestamp_ms;
    if (e.input_length < 1 || e.input_length > 2048 || e.output_length < 1 || e.output_length > 2048) {
      std::abort();
    }
    if (e.hash_ids.size() > (e.input_length + 15) / 16) std::abort();
  }
  for (const BenchRequest& r : make_trace_requests(entries, {.block_tokens = 16, .vocab_size = 2000})) {
    const std::vector<uint32_t> ids = trace_prompt_ids(r, 2000);
    if (ids.size() != r.input_len) std::abort();
    for (uint32_t id : ids) {
      if (id < kFirstTokenId || id >= 2000) std::abort();
    }
  }
  for (double offset : trace_arrival_offsets(entries, 3.0)) {
    if (!(offset >= 0)) std::abort();
  }
  return 0;
}
