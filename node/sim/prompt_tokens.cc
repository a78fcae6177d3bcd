#include "node/sim/prompt_tokens.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

void append_prompt(const json& prompt, std::vector<uint32_t>* out) {
  if (prompt.is_string()) return append_word_token_ids(prompt.get_ref<const std::string&>(), out);
  if (!prompt.is_array() || prompt.empty()) return;
  if (prompt[0].is_string() || prompt[0].is_array()) return append_prompt(prompt[0], out);
  for (const json& id : prompt) {
    if (id.is_number_unsigned()) {
      out->push_back(static_cast<uint32_t>(id.get<uint64_t>()));
    } else if (id.is_number_integer()) {
      out->push_back(static_cast<uint32_t>(id.get<int64_t>()));
    }
  }
}

void append_content(const json& content, std::vector<uint32_t>* out) {
  if (content.is_string()) return append_word_token_ids(content.get_ref<const std::string&>(), out);
  if (!content.is_array()) return;
  for (const json& part : content) {
    if (part.is_object() && part.contains("text") && part["text"].is_string()) {
      append_word_token_ids(part["text"].get_ref<const std::string&>(), out);
    }
  }
}

}  // namespace

uint32_t word_token_id(std::string_view word) {
  for (size_t i = 0; i < kSimVocabularySize; ++i) {
    if (sim_vocabulary_word(i) == word) return static_cast<uint32_t>(i);
  }
  uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : word) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return kFirstWordTokenId + static_cast<uint32_t>(hash % (kWordTokenIdEnd - kFirstWordTokenId));
}

void append_word_token_ids(std::string_view text, std::vector<uint32_t>* out) {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && is_space(text[i])) ++i;
    const size_t start = i;
    while (i < text.size() && !is_space(text[i])) ++i;
    if (i > start) out->push_back(word_token_id(text.substr(start, i - start)));
  }
}

std::vector<uint32_t> prompt_token_ids(ApiKind kind, const json& body) {
  std::vector<uint32_t> ids;
  if (!body.is_object()) return ids;
  if (kind == ApiKind::kCompletion) {
    if (body.contains("prompt")) append_prompt(body["prompt"], &ids);
    return ids;
  }
  if (kind == ApiKind::kGenerate) {
    if (body.contains("token_ids")) append_prompt(body["token_ids"], &ids);
    return ids;
  }
  if (kind == ApiKind::kResponses && body.contains("input")) {
    const json& input = body["input"];
    if (input.is_string()) {
      append_word_token_ids(input.get_ref<const std::string&>(), &ids);
    } else if (input.is_array()) {
      for (const json& item : input) {
        if (item.is_object() && item.contains("role") && item.contains("content")) {
          append_content(item["content"], &ids);
        }
      }
    }
    return ids;
  }
  // Anthropic's system prompt comes before the messages (vLLM makes it the first chat message).
  if (kind == ApiKind::kMessages && body.contains("system")) append_content(body["system"], &ids);
  if (!body.contains("messages") || !body["messages"].is_array()) return ids;
  for (const json& message : body["messages"]) {
    if (message.is_object() && message.contains("content")) {
      append_content(message["content"], &ids);
    }
  }
  return ids;
}

}  // namespace pdr::node::sim
