#include "bench/loadgen/trace_workload.h"

#include <cmath>
#include <limits>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace pdr::loadgen {
namespace {

using json = nlohmann::json;

constexpr int kMaxDepth = 8;

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// A shared block's seed depends on the run's seed and the hash id only; a request's own block's
// on the request and the block too, in a domain no hash id can reach (the extra mix round).
uint64_t shared_block_seed(uint64_t seed, uint64_t hash_id) {
  return mix(mix(seed ^ 0x5348415245440000ULL) ^ mix(hash_id + kGolden));
}
uint64_t own_block_seed(uint64_t seed, uint64_t request, uint64_t block) {
  return mix(mix(mix(seed ^ 0x4f574e0000000000ULL) ^ mix(request + kGolden)) ^ mix(block));
}

uint64_t block_count(uint32_t input_length, uint32_t block_tokens) {
  return (static_cast<uint64_t>(input_length) + block_tokens - 1) / block_tokens;
}

// Fills a TraceEntry from one line's SAX events, so nothing is built but the entry and a line
// that nests deeper than kMaxDepth stops the parser at once.
class LineHandler : public json::json_sax_t {
 public:
  LineHandler(const TraceReadOptions& options, TraceEntry* entry) : options_(options), entry_(entry) {}

  const std::string& error() const { return error_; }
  StatusCode code() const { return code_; }
  bool seen_all(std::string* missing) const {
    for (int f = kTimestamp; f <= kHashIds; ++f) {
      if (!seen_[f]) {
        *missing = kNames[f];
        return false;
      }
    }
    return true;
  }

  bool null() override { return scalar("null"); }
  bool boolean(bool) override { return scalar("a boolean"); }
  bool string(string_t&) override { return scalar("a string"); }
  bool binary(binary_t&) override { return scalar("binary"); }
  bool number_integer(number_integer_t) override {  // nlohmann: negative integers only
    if (in_hash_ids()) return fail("hash_ids must hold integers >= 0");
    if (depth_ != 1) return scalar_elsewhere();
    switch (field_) {
      case kTimestamp: return fail("timestamp must be a number >= 0");
      case kInput:
      case kOutput: return fail(fmt::format("{} must be an integer >= 1", kNames[field_]));
      case kHashIds: return fail("hash_ids must be an array");
      default: return true;
    }
  }
  bool number_unsigned(number_unsigned_t value) override {
    if (in_hash_ids()) {
      if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return fail("hash_ids must hold integers in [0, 2^63)", StatusCode::kOutOfRange);
      }
      entry_->hash_ids.push_back(value);
      return true;
    }
    if (depth_ != 1) return scalar_elsewhere();
    switch (field_) {
      case kTimestamp: entry_->timestamp_ms = static_cast<double>(value); return true;
      case kInput: return length(value, options_.limits.max_input_length, &entry_->input_length);
      case kOutput: return length(value, options_.limits.max_output_length, &entry_->output_length);
      case kHashIds: return fail("hash_ids must be an array");
      default: return true;
    }
  }
  bool number_float(number_float_t value, const string_t&) override {
    if (in_hash_ids()) return fail("hash_ids must hold integers >= 0");
    if (depth_ != 1) return scalar_elsewhere();
    switch (field_) {
      case kTimestamp:
        if (!std::isfinite(value) || value < 0) {
          return fail("timestamp must be a number >= 0", StatusCode::kOutOfRange);
        }
        entry_->timestamp_ms = value;
        return true;
      case kInput:
      case kOutput: return fail(fmt::format("{} must be an integer >= 1", kNames[field_]));
      case kHashIds: return fail("hash_ids must be an array");
      default: return true;
    }
  }
  bool start_object(std::size_t) override {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    if (depth_ == 1 && field_ != kUnknown) return wrong_container("an object");
    if (in_hash_ids()) return fail("hash_ids must hold integers >= 0");
    return deeper();
  }
  bool end_object() override {
    --depth_;
    return true;
  }
  bool key(string_t& name) override {
    if (depth_ != 1) return true;
    field_ = kUnknown;
    for (int f = kTimestamp; f <= kHashIds; ++f) {
      if (name == kNames[f]) field_ = static_cast<Field>(f);
    }
    if (field_ == kUnknown) return true;
    if (seen_[field_]) return fail(fmt::format("{} appears twice", kNames[field_]), StatusCode::kMalformed);
    seen_[field_] = true;
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth_ == 0) return fail("not a JSON object");
    if (depth_ == 1 && field_ == kHashIds) {
      depth_ = 2;
      return true;
    }
    if (depth_ == 1 && field_ != kUnknown) return wrong_container("an array");
    if (in_hash_ids()) return fail("hash_ids must hold integers >= 0");
    return deeper();
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) override {
    return fail(fmt::format("invalid JSON (the parser stopped at byte {})", position), StatusCode::kMalformed);
  }

 private:
  enum Field { kTimestamp, kInput, kOutput, kHashIds, kUnknown };
  static constexpr const char* kNames[] = {"timestamp", "input_length", "output_length", "hash_ids"};

  bool in_hash_ids() const { return depth_ == 2 && field_ == kHashIds; }
  bool fail(std::string message, StatusCode code = StatusCode::kWrongType) {
    if (error_.empty()) {
      error_ = std::move(message);
      code_ = code;
    }
    return false;
  }
  bool scalar(const char* what) {
    if (depth_ == 0) return fail("not a JSON object");
    if (in_hash_ids()) return fail("hash_ids must hold integers >= 0");
    if (depth_ != 1 || field_ == kUnknown) return true;
    return fail(fmt::format("{} must be {}, not {}", kNames[field_], expected(field_), what));
  }
  bool scalar_elsewhere() { return depth_ == 0 ? fail("not a JSON object") : true; }
  bool wrong_container(const char* what) {
    return fail(fmt::format("{} must be {}, not {}", kNames[field_], expected(field_), what));
  }
  static const char* expected(Field f) {
    switch (f) {
      case kTimestamp: return "a number >= 0";
      case kHashIds: return "an array of integers";
      default: return "an integer >= 1";
    }
  }
  bool deeper() {
    if (++depth_ > kMaxDepth) return fail(fmt::format("nested deeper than {}", kMaxDepth), StatusCode::kTooDeep);
    return true;
  }
  bool length(uint64_t value, uint32_t limit, uint32_t* out) {
    if (value < 1 || value > limit) {
      return fail(fmt::format("{} must be in [1, {}], got {}", kNames[field_], limit, value),
                  StatusCode::kOutOfRange);
    }
    *out = static_cast<uint32_t>(value);
    return true;
  }

  const TraceReadOptions& options_;
  TraceEntry* entry_;
  int depth_ = 0;
  Field field_ = kUnknown;
  bool seen_[4] = {false, false, false, false};
  std::string error_;
  StatusCode code_ = StatusCode::kMalformed;
};

bool blank(std::string_view line) {
  return line.find_first_not_of(" \t\r") == std::string_view::npos;
}

// Reads one line into *line (without its '\n' or a '\r' before it). False at the end of the
// stream with nothing read. *too_long: the line passed max bytes; its rest is skipped.
bool next_line(std::streambuf* in, size_t max, std::string* line, bool* too_long) {
  line->clear();
  *too_long = false;
  bool any = false;
  for (int c = in->sbumpc(); c != std::char_traits<char>::eof(); c = in->sbumpc()) {
    any = true;
    if (c == '\n') break;
    if (line->size() >= max) {
      *too_long = true;
      continue;
    }
    line->push_back(static_cast<char>(c));
  }
  if (!line->empty() && line->back() == '\r') line->pop_back();
  return any;
}

}  // namespace

Status parse_trace_line(std::string_view line, const TraceReadOptions& options, TraceEntry* out) {
  TraceEntry entry;
  LineHandler handler(options, &entry);
  bool parsed = false;
  try {
    parsed = json::sax_parse(line, &handler);
  } catch (const json::exception& e) {  // none expected from a SAX parse; never across the caller
    return {StatusCode::kMalformed, fmt::format("invalid JSON: {}", e.what())};
  }
  if (!parsed) {
    if (handler.error().empty()) return {StatusCode::kMalformed, "invalid JSON"};
    return {handler.code(), handler.error()};
  }
  std::string missing;
  if (!handler.seen_all(&missing)) return {StatusCode::kMissingKey, missing + " is missing"};
  const uint64_t blocks = block_count(entry.input_length, options.block_tokens);
  if (entry.hash_ids.size() > blocks) {
    return {StatusCode::kOutOfRange,
            fmt::format("hash_ids lists {} blocks; input_length {} has {} of {} tokens",
                        entry.hash_ids.size(), entry.input_length, blocks, options.block_tokens)};
  }
  *out = std::move(entry);
  return {};
}

Status read_trace(std::istream& in, const std::string& name, const TraceReadOptions& options,
                  std::vector<TraceEntry>* out) {
  if (options.block_tokens == 0) return {StatusCode::kInvalidValue, "the trace block size must be >= 1"};
  std::vector<TraceEntry> entries;
  std::string line;
  bool too_long = false;
  uint64_t total_tokens = 0;
  std::streambuf* buffer = in.rdbuf();
  for (size_t number = 1;
       (options.max_requests == 0 || entries.size() < options.max_requests) && buffer != nullptr &&
       next_line(buffer, options.limits.max_line_bytes, &line, &too_long);
       ++number) {
    const auto refuse = [&](StatusCode code, std::string_view why) {
      return Status{code, fmt::format("{} line {}: {}", name, number, why)};
    };
    if (too_long) {
      return refuse(StatusCode::kTooLarge,
                    fmt::format("longer than {} bytes", options.limits.max_line_bytes));
    }
    if (blank(line)) continue;
    if (entries.size() >= options.limits.max_entries) {
      return refuse(StatusCode::kTooLarge,
                    fmt::format("more than {} requests", options.limits.max_entries));
    }
    TraceEntry entry;
    if (Status s = parse_trace_line(line, options, &entry); !s) return refuse(s.code(), s.message());
    if (!entries.empty() && entry.timestamp_ms < entries.back().timestamp_ms) {
      return refuse(StatusCode::kMalformed,
                    fmt::format("timestamp {} is before the previous line's {} (a trace lists "
                                "requests in arrival order)",
                                entry.timestamp_ms, entries.back().timestamp_ms));
    }
    total_tokens += entry.input_length;
    if (total_tokens > options.limits.max_total_input_tokens) {
      return refuse(StatusCode::kTooLarge,
                    fmt::format("the prompts read so far total more than {} tokens (pass "
                                "--num-prompts to replay the start of the trace)",
                                options.limits.max_total_input_tokens));
    }
    entries.push_back(std::move(entry));
  }
  if (in.bad()) return {StatusCode::kIoError, fmt::format("{}: read error", name)};
  if (entries.empty()) return {StatusCode::kNotFound, fmt::format("{}: no request in the trace", name)};
  *out = std::move(entries);
  return {};
}

std::vector<BenchRequest> make_trace_requests(const std::vector<TraceEntry>& entries,
                                              const TracePromptOptions& options) {
  std::vector<BenchRequest> requests(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const TraceEntry& entry = entries[i];
    BenchRequest& request = requests[i];
    request.index = static_cast<uint32_t>(i);
    request.input_len = entry.input_length;
    request.output_len = entry.output_length;
    request.block_tokens = options.block_tokens;
    const uint64_t blocks = block_count(entry.input_length, options.block_tokens);
    request.block_seeds.reserve(blocks);
    for (uint64_t b = 0; b < blocks; ++b) {
      const bool full = (b + 1) * options.block_tokens <= entry.input_length;
      request.block_seeds.push_back(full && b < entry.hash_ids.size()
                                        ? shared_block_seed(options.seed, entry.hash_ids[b])
                                        : own_block_seed(options.seed, i, b));
    }
  }
  return requests;
}

std::vector<uint32_t> trace_prompt_ids(const BenchRequest& request, uint32_t vocab_size) {
  std::vector<uint32_t> ids;
  ids.reserve(request.input_len);
  const uint32_t span = vocab_size > kFirstTokenId ? vocab_size - kFirstTokenId : 1;
  for (size_t b = 0; b < request.block_seeds.size() && ids.size() < request.input_len; ++b) {
    uint64_t state = request.block_seeds[b];
    const size_t end = std::min<size_t>(request.input_len, ids.size() + request.block_tokens);
    while (ids.size() < end) {
      state += kGolden;
      ids.push_back(kFirstTokenId + static_cast<uint32_t>(mix(state) % span));
    }
  }
  return ids;
}

std::vector<double> trace_arrival_offsets(const std::vector<TraceEntry>& entries, double speedup) {
  std::vector<double> offsets;
  offsets.reserve(entries.size());
  const double first = entries.empty() ? 0.0 : entries.front().timestamp_ms;
  for (const TraceEntry& entry : entries) {
    offsets.push_back((entry.timestamp_ms - first) / 1000.0 / speedup);
  }
  return offsets;
}

}  // namespace pdr::loadgen
