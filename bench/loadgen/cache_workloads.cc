#include "bench/loadgen/cache_workloads.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>

#include "bench/loadgen/prefix_oracle.h"

namespace pdr::loadgen {
namespace {

// A prompt of `count` tokens in the workload's format, from rng.
void fill_prompt(std::mt19937_64& rng, const WorkloadOptions& workload, uint32_t count,
                 std::string* text, std::vector<uint32_t>* ids) {
  if (workload.format == PromptFormat::kWords) {
    append_random_words(rng, count, text);
  } else {
    append_random_ids(rng, count, workload.vocab_size, ids);
  }
}

void set_prompt(const WorkloadOptions& workload, std::string text, const std::vector<uint32_t>& ids,
                BenchRequest* request) {
  if (workload.format == PromptFormat::kWords) {
    request->prompt_json = nlohmann::json(text).dump();
    request->prompt_text = std::move(text);
  } else {
    request->prompt_json = token_ids_json(ids);
  }
}

Status check_format(const WorkloadOptions& workload) {
  if (workload.format == PromptFormat::kTokenIds && workload.vocab_size <= kFirstTokenId) {
    return {StatusCode::kOutOfRange,
            fmt::format("--vocab-size must be > {}, got {}", kFirstTokenId, workload.vocab_size)};
  }
  return {};
}

Status check_total(double total_tokens, std::string_view what) {
  if (total_tokens > static_cast<double>(kMaxTotalPromptTokens)) {
    return {StatusCode::kOutOfRange,
            fmt::format("{} make {:.0f} prompt tokens; at most {} (prompts are generated before "
                        "the run)",
                        what, total_tokens, kMaxTotalPromptTokens)};
  }
  return {};
}

// FNV-1a: a stable stand-in id for a word of an answer.
uint32_t standin_id(std::string_view word, uint32_t vocab_size) {
  uint64_t h = 1469598103934665603ULL;
  for (const char c : word) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return kFirstTokenId + static_cast<uint32_t>(h % (vocab_size - kFirstTokenId));
}

// An answer is untrusted text: invalid UTF-8 in it becomes U+FFFD instead of an exception.
std::string dump_lenient(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

Status validate(const WorkloadOptions& workload, const PrefixRepetitionOptions& options) {
  if (workload.num_prompts == 0) return {StatusCode::kOutOfRange, "--num-prompts must be >= 1"};
  if (options.prefix_len == 0) {
    return {StatusCode::kOutOfRange, "--prefix-repetition-prefix-len must be >= 1"};
  }
  if (options.num_prefixes == 0 || options.num_prefixes > workload.num_prompts) {
    return {
        StatusCode::kOutOfRange,
        fmt::format("--prefix-repetition-num-prefixes must be in [1, --num-prompts = {}], got {}",
                    workload.num_prompts, options.num_prefixes)};
  }
  if (options.output_len == 0) {
    return {StatusCode::kOutOfRange, "--prefix-repetition-output-len must be >= 1"};
  }
  if (Status s = check_format(workload); !s) return s;
  return check_total(static_cast<double>(workload.num_prompts) *
                         (static_cast<double>(options.prefix_len) + options.suffix_len),
                     "--num-prompts x (--prefix-repetition-prefix-len + -suffix-len)");
}

Status validate(const WorkloadOptions& workload, const MultiTurnOptions& options) {
  if (options.num_conversations == 0) {
    return {StatusCode::kOutOfRange, "--multi-turn-num-conversations must be >= 1"};
  }
  if (options.num_turns == 0)
    return {StatusCode::kOutOfRange, "--multi-turn-num-turns must be >= 1"};
  if (options.input_len == 0)
    return {StatusCode::kOutOfRange, "--multi-turn-input-len must be >= 1"};
  if (options.output_len == 0) {
    return {StatusCode::kOutOfRange, "--multi-turn-output-len must be >= 1"};
  }
  if (Status s = check_format(workload); !s) return s;
  // Turn k's prompt is (k + 1) messages and k answers; summed over the turns of a conversation:
  // turns * (turns + 1) / 2 messages and turns * (turns - 1) / 2 answers.
  const double turns = options.num_turns;
  const double per_conversation =
      turns * (turns + 1) / 2 * options.input_len + turns * (turns - 1) / 2 * options.output_len;
  return check_total(options.num_conversations * per_conversation,
                     "--multi-turn-num-conversations x -num-turns x (-input-len + -output-len)");
}

std::vector<BenchRequest> make_prefix_repetition_requests(const WorkloadOptions& workload,
                                                          const PrefixRepetitionOptions& options) {
  std::mt19937_64 rng(workload.seed);
  std::vector<std::string> prefix_texts(options.num_prefixes);
  std::vector<std::vector<uint32_t>> prefix_ids(options.num_prefixes);
  for (uint32_t p = 0; p < options.num_prefixes; ++p) {
    fill_prompt(rng, workload, options.prefix_len, &prefix_texts[p], &prefix_ids[p]);
  }
  // Request i uses prefix i % num_prefixes: an even share each (the first prefixes take the
  // remainder); the order is then shuffled, as vLLM's dataset does.
  std::vector<uint32_t> order(workload.num_prompts);
  for (uint32_t i = 0; i < workload.num_prompts; ++i) order[i] = i % options.num_prefixes;
  std::shuffle(order.begin(), order.end(), rng);

  std::vector<BenchRequest> requests(workload.num_prompts);
  for (uint32_t i = 0; i < workload.num_prompts; ++i) {
    BenchRequest& request = requests[i];
    const uint32_t p = order[i];
    request.index = i;
    request.input_len = options.prefix_len + options.suffix_len;
    request.output_len = options.output_len;
    std::string text = prefix_texts[p];
    std::vector<uint32_t> ids = prefix_ids[p];
    if (options.suffix_len > 0 && !text.empty()) text.push_back(' ');
    fill_prompt(rng, workload, options.suffix_len, &text, &ids);
    set_prompt(workload, std::move(text), ids, &request);
  }
  return requests;
}

std::vector<BenchRequest> make_multi_turn_requests(const WorkloadOptions& workload,
                                                   const MultiTurnOptions& options) {
  std::mt19937_64 rng(workload.seed);
  const uint32_t n = options.num_conversations;
  std::vector<BenchRequest> requests(static_cast<size_t>(n) * options.num_turns);
  // Generated conversation by conversation, so a conversation's messages do not depend on how
  // many conversations there are beyond it.
  for (uint32_t c = 0; c < n; ++c) {
    for (uint32_t k = 0; k < options.num_turns; ++k) {
      const uint32_t i = k * n + c;
      BenchRequest& request = requests[i];
      request.index = i;
      request.input_len = options.input_len;
      request.output_len = options.output_len;
      if (k > 0) request.previous_turn = i - n;
      if (options.conversation_ids) request.conversation_id = "conv-" + std::to_string(c);
      std::string text;
      std::vector<uint32_t> ids;
      fill_prompt(rng, workload, options.input_len, &text, &ids);
      set_prompt(workload, std::move(text), ids, &request);
    }
  }
  return requests;
}

BenchRequest compose_turn(const BenchRequest& previous, std::string_view answer,
                          const BenchRequest& turn, PromptFormat format, bool chat,
                          uint32_t vocab_size) {
  BenchRequest out;
  out.index = turn.index;
  out.previous_turn = turn.previous_turn;
  out.output_len = turn.output_len;
  out.conversation_id = turn.conversation_id;
  const std::vector<std::string_view> answer_words = words_of(answer);
  out.input_len = previous.input_len + static_cast<uint32_t>(answer_words.size()) + turn.input_len;
  if (format == PromptFormat::kTokenIds) {
    std::vector<uint32_t> standin;
    standin.reserve(answer_words.size());
    for (std::string_view word : answer_words) standin.push_back(standin_id(word, vocab_size));
    // previous "[...]" and turn "[...]" are non-empty arrays: splice them.
    std::string& json = out.prompt_json;
    json = previous.prompt_json.substr(0, previous.prompt_json.size() - 1);
    if (!standin.empty()) {
      const std::string middle = token_ids_json(standin);
      json += ",";
      json.append(middle, 1, middle.size() - 2);
    }
    json += ",";
    json.append(turn.prompt_json, 1, std::string::npos);
    return out;
  }
  out.prompt_text = previous.prompt_text;
  if (!answer.empty()) {
    out.prompt_text += " ";
    out.prompt_text += answer;
  }
  out.prompt_text += " ";
  out.prompt_text += turn.prompt_text;
  out.prompt_json = dump_lenient(nlohmann::json(out.prompt_text));
  if (chat) {
    nlohmann::json messages =
        previous.messages_json.empty()
            ? nlohmann::json::array({{{"role", "user"}, {"content", previous.prompt_text}}})
            : nlohmann::json::parse(previous.messages_json);
    messages.push_back({{"role", "assistant"}, {"content", std::string(answer)}});
    messages.push_back({{"role", "user"}, {"content", turn.prompt_text}});
    out.messages_json = dump_lenient(messages);
  }
  return out;
}

}  // namespace pdr::loadgen
