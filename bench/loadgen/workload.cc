#include "bench/loadgen/workload.h"

#include <iterator>
#include <cmath>
#include <limits>
#include <random>
#include <string_view>

#include <fmt/format.h>

namespace pdr::loadgen {
namespace {

// Common English words: each is a single token, with its leading space, in the Llama, Qwen and
// GPT tokenizers, so a prompt of N words is close to N tokens on a real model too.
constexpr std::string_view kWords[] = {
    "the",   "of",     "and",   "to",    "in",    "is",    "was",   "that",  "for",   "on",
    "as",    "with",   "by",    "he",    "at",    "from",  "his",   "an",    "were",  "are",
    "which", "this",   "also",  "be",    "had",   "or",    "has",   "first", "one",   "their",
    "its",   "new",    "after", "but",   "who",   "not",   "they",  "have",  "her",   "she",
    "two",   "been",   "other", "when",  "there", "all",   "into",  "more",  "time",  "would",
    "only",  "some",   "years", "city",  "over",  "may",   "world", "could", "where", "most",
    "under", "then",   "about", "them",  "made",  "known", "while", "many",  "state", "year",
    "such",  "used",   "three", "part",  "these", "later", "high",  "until", "early", "both",
    "south", "north",  "being", "between", "family", "during", "film", "people", "work", "game",
    "water", "house",  "music", "small", "great", "place", "large", "local", "since", "well",
    "long",  "life",   "group", "day",   "back",  "found", "team",  "name",  "each",  "show",
    "west",  "east",   "power", "light", "road",  "river", "line",  "point", "land",  "club",
    "book",  "school", "paper", "field", "table", "green", "stone", "open"};

uint32_t draw_length(std::mt19937_64& rng, uint32_t len, double ratio) {
  if (ratio <= 0.0) return len;
  const auto low = static_cast<uint32_t>(std::max(1.0, std::floor(len * (1.0 - ratio))));
  const auto high = static_cast<uint32_t>(std::ceil(len * (1.0 + ratio)));
  return std::uniform_int_distribution<uint32_t>(low, high)(rng);
}

}  // namespace

Status validate(const WorkloadOptions& options) {
  if (options.num_prompts == 0) return {StatusCode::kOutOfRange, "--num-prompts must be >= 1"};
  if (options.input_len == 0) return {StatusCode::kOutOfRange, "--random-input-len must be >= 1"};
  if (options.output_len == 0) return {StatusCode::kOutOfRange, "--random-output-len must be >= 1"};
  if (!(options.range_ratio >= 0.0 && options.range_ratio < 1.0)) {
    return {StatusCode::kOutOfRange,
            fmt::format("--random-range-ratio must be in [0, 1), got {}", options.range_ratio)};
  }
  // Prompts are generated up front (as vLLM does), so their total size is bounded.
  const double total_tokens =
      static_cast<double>(options.num_prompts) * options.input_len * (1.0 + options.range_ratio);
  if (total_tokens > static_cast<double>(kMaxTotalPromptTokens)) {
    return {StatusCode::kOutOfRange,
            fmt::format("--num-prompts x --random-input-len is {:.0f} tokens; at most {} (prompts "
                        "are generated before the run)",
                        total_tokens, kMaxTotalPromptTokens)};
  }
  if (options.format == PromptFormat::kTokenIds && options.vocab_size <= kFirstTokenId) {
    return {StatusCode::kOutOfRange,
            fmt::format("--vocab-size must be > {}, got {}", kFirstTokenId, options.vocab_size)};
  }
  return {};
}

void append_random_words(std::mt19937_64& rng, uint32_t count, std::string* text) {
  std::uniform_int_distribution<size_t> pick_word(0, std::size(kWords) - 1);
  text->reserve(text->size() + count * 6);
  for (uint32_t t = 0; t < count; ++t) {
    if (t != 0) text->push_back(' ');
    text->append(kWords[pick_word(rng)]);
  }
}

void append_random_ids(std::mt19937_64& rng, uint32_t count, uint32_t vocab_size,
                       std::vector<uint32_t>* ids) {
  std::uniform_int_distribution<uint32_t> pick_id(kFirstTokenId, vocab_size - 1);
  ids->reserve(ids->size() + count);
  for (uint32_t t = 0; t < count; ++t) ids->push_back(pick_id(rng));
}

std::string token_ids_json(const std::vector<uint32_t>& ids) {
  std::string json;
  json.reserve(ids.size() * 7 + 2);
  json.push_back('[');
  for (size_t t = 0; t < ids.size(); ++t) {
    if (t != 0) json.push_back(',');
    fmt::format_to(std::back_inserter(json), "{}", ids[t]);
  }
  json.push_back(']');
  return json;
}

std::vector<BenchRequest> make_random_requests(const WorkloadOptions& options) {
  std::mt19937_64 rng(options.seed);
  std::vector<BenchRequest> requests(options.num_prompts);
  for (uint32_t i = 0; i < options.num_prompts; ++i) {
    BenchRequest& request = requests[i];
    request.index = i;
    request.input_len = draw_length(rng, options.input_len, options.range_ratio);
    request.output_len = draw_length(rng, options.output_len, options.range_ratio);
    if (options.format == PromptFormat::kWords) {
      append_random_words(rng, request.input_len, &request.prompt_text);
      // Plain lowercase ASCII words: quoting is the whole JSON encoding.
      request.prompt_json = fmt::format("\"{}\"", request.prompt_text);
    } else {
      std::vector<uint32_t> ids;
      append_random_ids(rng, request.input_len, options.vocab_size, &ids);
      request.prompt_json = token_ids_json(ids);
    }
  }
  return requests;
}

std::vector<double> arrival_offsets(uint32_t count, double rate, double burstiness, uint64_t seed) {
  std::vector<double> offsets(count, 0.0);
  if (!(rate > 0.0) || std::isinf(rate) || count == 0) return offsets;
  // Mean gap = shape * scale = 1 / rate.
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);  // not the prompts' stream
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (uint32_t i = 1; i < count; ++i) offsets[i] = offsets[i - 1] + gap(rng);
  return offsets;
}

}  // namespace pdr::loadgen
