// Replaying a request trace in the Mooncake format (kvcache-ai/Mooncake, FAST25-release/traces):
// one JSON object per line,
//   {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}
// timestamp: arrival in milliseconds from the trace's start; input_length / output_length:
// prompt and answer tokens; hash_ids: the prompt's blocks of block_tokens (512) tokens as
// remapped, prefix-chained block ids (two requests whose lists start alike share that prefix).
//
// The trace carries no text, so prompts are token ids made up here, deterministic for a seed:
//   - a full block (block_tokens long) with a hash id gets ids drawn from (seed, hash id): equal
//     hash ids give identical blocks in every request, different ones different blocks;
//   - the last block when it is partial (input_length not a multiple of block_tokens), and every
//     block beyond the hash ids listed, gets ids drawn from (seed, request, block): unique to
//     the request. A prefix cache can then hit exactly what the trace says is shared.
// A prompt is input_length ids in [kFirstTokenId, vocab_size). Requests keep only the blocks'
// seeds (BenchRequest::block_seeds); trace_prompt_ids() builds the ids when the request is sent,
// so a long trace is not held in memory as token ids.
//
// Arrivals: the timestamps relative to the first entry's, divided by the speed-up. Pure: the
// parser reads a stream, nothing else touches I/O.
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

#include "proto/base/status.h"
#include "bench/loadgen/workload.h"

namespace pdr::loadgen {

struct TraceEntry {
  double timestamp_ms = 0;
  uint32_t input_length = 0;
  uint32_t output_length = 0;
  std::vector<uint64_t> hash_ids;
};

struct TraceLimits {
  size_t max_line_bytes = 1 << 20;       // one line; a 10M-token prompt's ids fit in ~160 KB
  size_t max_entries = 10'000'000;       // lines with a request (the file is refused beyond)
  uint32_t max_input_length = 10'000'000;
  uint32_t max_output_length = 10'000'000;
  uint64_t max_total_input_tokens = kMaxTotalPromptTokens;  // over the entries read
};

struct TraceReadOptions {
  uint32_t block_tokens = 512;  // tokens per hash id
  size_t max_requests = 0;      // stop after this many entries (0: read every line)
  TraceLimits limits;
};

// Reads entries until the end of `in` or max_requests. Blank lines (whitespace only) are
// skipped. A line is refused, and the whole read fails naming `name` and the line number, when:
// it is longer than max_line_bytes; it is not one JSON object; timestamp is missing, not a
// finite number >= 0, or smaller than the previous line's (a trace is in arrival order);
// input_length or output_length is missing, not an integer, below 1 or above its limit;
// hash_ids is missing, not an array of integers in [0, 2^63), or lists more ids than the
// prompt has blocks (ceil(input_length / block_tokens)); a key appears twice; a value nests
// deeper than 8. Unknown keys are ignored. Fewer hash ids than blocks is allowed (the blocks
// without one are unique to the request). Errors: kMalformed (not JSON, a key twice, timestamps
// out of order), kWrongType, kMissingKey, kOutOfRange, kTooDeep, kTooLarge (a line, the entry
// count or the total tokens over their limit), kNotFound (no entry), kIoError, kInvalidValue
// (block_tokens 0).
Status read_trace(std::istream& in, const std::string& name, const TraceReadOptions& options,
                  std::vector<TraceEntry>* out);

// One line's entry (read_trace's checks but the timestamp order); for tests and the fuzzer.
Status parse_trace_line(std::string_view line, const TraceReadOptions& options, TraceEntry* out);

struct TracePromptOptions {
  uint32_t block_tokens = 512;
  uint32_t vocab_size = 32000;  // > kFirstTokenId
  uint64_t seed = 0;
};

// One request per entry, index i for entry i: input_len, output_len, block_seeds and
// block_tokens set; prompt_json left empty (see trace_prompt_ids).
std::vector<BenchRequest> make_trace_requests(const std::vector<TraceEntry>& entries,
                                              const TracePromptOptions& options);

// The prompt of a trace request: request.input_len ids, block b from block_seeds[b].
std::vector<uint32_t> trace_prompt_ids(const BenchRequest& request, uint32_t vocab_size);

// Send times in seconds from the first entry's arrival: (timestamp - first) / 1000 / speedup.
// speedup > 0.
std::vector<double> trace_arrival_offsets(const std::vector<TraceEntry>& entries, double speedup);

}  // namespace pdr::loadgen
