#include "node/sim/aux_api.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

#include "node/sim/generation.h"
#include "node/sim/prompt_tokens.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;

constexpr size_t kEmbeddingDims = 8;
constexpr size_t kMaxEmbeddingInputs = 2048;    // vLLM bounds a batch by the model; ours is fixed
constexpr size_t kMaxDetokenizeIds = 1000000;

SimError bad_request(std::string reason, std::string message) {
  return SimError{400, std::move(reason), std::move(message)};
}

// "model" absent or null: the served model; another name: vLLM's 404.
std::optional<SimError> check_model(const json& body, const AuxContext& ctx, std::string* model) {
  if (!body.is_object()) return bad_request("bad_json", "request body must be a JSON object");
  *model = ctx.served_model;
  if (!body.contains("model") || body["model"].is_null()) return std::nullopt;
  if (!body["model"].is_string()) return bad_request("bad_model", "model must be a string");
  if (body["model"].get<std::string>() != ctx.served_model) {
    return SimError{404, "model_not_found", "The model `" + body["model"].get<std::string>() + "` does not exist."};
  }
  return std::nullopt;
}

std::string id_text(int64_t id) {
  if (id >= 0 && static_cast<uint64_t>(id) < kSimVocabularySize) return std::string(sim_vocabulary_word(static_cast<size_t>(id)));
  return "<" + std::to_string(id) + ">";
}

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(bytes[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8) | static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (i + 1 < bytes.size()) v |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// `size` deterministic bytes derived from `seed` (xorshift64).
std::string fake_bytes(uint64_t seed, size_t size) {
  std::string out(size, '\0');
  uint64_t x = seed | 1;
  for (size_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<char>(x & 0xff);
  }
  return out;
}

std::string hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The image parts of a chat request, in order: their URL (or the part's dump when it has none).
std::vector<std::string> image_parts(const json& messages) {
  std::vector<std::string> out;
  for (const json& message : messages) {
    if (!message.is_object() || !message.contains("content") || !message["content"].is_array()) continue;
    for (const json& part : message["content"]) {
      if (!part.is_object() || part.value("type", std::string()) != "image_url") continue;
      const json url = part.contains("image_url") && part["image_url"].is_object()
                           ? part["image_url"].value("url", json())
                           : json();
      out.push_back(url.is_string() ? url.get<std::string>() : part.dump());
    }
  }
  return out;
}

// One render result: the prompt's token ids, then `placeholder` ids per image.
json render_object(const GenerationRequest& req, const std::vector<std::string>& images, const AuxContext& ctx) {
  constexpr int64_t kImageTokenId = 151655;  // an id above the text ids, as a VLM's image token
  constexpr size_t kPlaceholderTokens = 16;
  json token_ids = json::array();
  for (int64_t id : sim_token_ids(req.prompt_text)) token_ids.push_back(id);
  json features = nullptr;
  if (!images.empty()) {
    json hashes = json::array(), placeholders = json::array(), data = json::array();
    for (const std::string& url : images) {
      const uint64_t h = sim_fnv1a(url);
      hashes.push_back(hex16(h) + hex16(sim_fnv1a(url, h)));
      placeholders.push_back(json{{"offset", token_ids.size()}, {"length", kPlaceholderTokens}});
      for (size_t i = 0; i < kPlaceholderTokens; ++i) token_ids.push_back(kImageTokenId);
      data.push_back(base64(fake_bytes(h, ctx.feature_bytes)));
    }
    features = json{{"mm_hashes", {{"image", hashes}}},
                    {"mm_placeholders", {{"image", placeholders}}},
                    {"kwargs_data", {{"image", data}}}};
  }
  json sampling{{"max_tokens", req.max_tokens}};
  return json{{"request_id", ctx.request_id}, {"model", req.model},          {"token_ids", token_ids},
              {"features", features},         {"sampling_params", sampling}, {"kv_transfer_params", nullptr}};
}

}  // namespace

std::vector<int64_t> sim_token_ids(std::string_view text) {
  std::vector<int64_t> ids;
  size_t i = 0;
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  while (i < text.size()) {
    while (i < text.size() && space(text[i])) ++i;
    const size_t start = i;
    while (i < text.size() && !space(text[i])) ++i;
    if (i > start) ids.push_back(word_token_id(text.substr(start, i - start)));
  }
  return ids;
}

std::optional<SimError> sim_tokenize(const json& body, const AuxContext& ctx, std::string* out) {
  std::string model;
  if (auto e = check_model(body, ctx, &model)) return e;
  // The ids the prefix cache hashes (prompt_tokens.h): a chat's are its messages' words.
  std::vector<uint32_t> ids;
  if (body.contains("prompt")) {
    if (!body["prompt"].is_string()) return bad_request("bad_prompt", "prompt must be a string");
    ids = prompt_token_ids(ApiKind::kCompletion, body);
  } else if (body.contains("messages")) {
    GenerationRequest req;
    if (auto e = parse_generation_request(ApiKind::kChat, json{{"messages", body["messages"]}}, ctx.served_model, &req)) {
      return e;
    }
    ids = prompt_token_ids(ApiKind::kChat, body);
  } else {
    return bad_request("bad_prompt", "prompt or messages is required");
  }
  json answer{{"count", ids.size()}, {"max_model_len", ctx.max_model_len}, {"tokens", ids}, {"token_strs", nullptr}};
  if (body.value("return_token_strs", false) == true) {
    json strs = json::array();
    for (uint32_t id : ids) strs.push_back(id_text(id));
    answer["token_strs"] = std::move(strs);
  }
  *out = answer.dump();
  return std::nullopt;
}

std::optional<SimError> sim_detokenize(const json& body, const AuxContext& ctx, std::string* out) {
  std::string model;
  if (auto e = check_model(body, ctx, &model)) return e;
  if (!body.contains("tokens") || !body["tokens"].is_array() || body["tokens"].size() > kMaxDetokenizeIds) {
    return bad_request("bad_tokens", "tokens must be a list of token ids");
  }
  std::string prompt;
  for (const json& id : body["tokens"]) {
    if (!id.is_number_integer()) return bad_request("bad_tokens", "tokens must be a list of token ids");
    if (!prompt.empty()) prompt += ' ';
    prompt += id_text(id.get<int64_t>());
  }
  *out = json{{"prompt", prompt}}.dump();
  return std::nullopt;
}

std::optional<SimError> sim_embeddings(const json& body, const AuxContext& ctx, std::string* out) {
  std::string model;
  if (auto e = check_model(body, ctx, &model)) return e;
  if (!body.contains("input")) return bad_request("bad_input", "input is required");
  // input: a string, a list of strings, a token-id list or a list of token-id lists.
  const json& input = body["input"];
  std::vector<std::string> texts;  // each input's text (token lists: their dump)
  std::vector<size_t> tokens;
  auto all_ints = [](const json& list) {
    for (const json& v : list) {
      if (!v.is_number_integer()) return false;
    }
    return true;
  };
  if (input.is_string()) {
    texts.push_back(input.get<std::string>());
    tokens.push_back(sim_token_ids(texts.back()).size());
  } else if (input.is_array() && !input.empty() && input.size() <= kMaxEmbeddingInputs) {
    if (all_ints(input)) {
      texts.push_back(input.dump());
      tokens.push_back(input.size());
    } else {
      for (const json& item : input) {
        if (item.is_string()) {
          texts.push_back(item.get<std::string>());
          tokens.push_back(sim_token_ids(texts.back()).size());
        } else if (item.is_array() && all_ints(item)) {
          texts.push_back(item.dump());
          tokens.push_back(item.size());
        } else {
          return bad_request("bad_input", "input must be a string, a list of strings or token ids");
        }
      }
    }
  } else {
    return bad_request("bad_input", "input must be a string, a list of strings or token ids");
  }
  json data = json::array();
  size_t total = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    // A unit vector derived from the text: the same input always embeds the same.
    std::array<double, kEmbeddingDims> v{};
    double norm = 0;
    for (size_t d = 0; d < kEmbeddingDims; ++d) {
      v[d] = static_cast<double>(sim_fnv1a(std::to_string(d), sim_fnv1a(texts[i])) % 2001) / 1000.0 - 1.0;
      norm += v[d] * v[d];
    }
    norm = norm > 0 ? std::sqrt(norm) : 1.0;
    json embedding = json::array();
    for (double x : v) embedding.push_back(x / norm);
    data.push_back(json{{"index", i}, {"object", "embedding"}, {"embedding", embedding}});
    total += tokens[i];
  }
  *out = json{{"id", "embd-" + ctx.request_id},
              {"object", "list"},
              {"created", ctx.created},
              {"model", model},
              {"data", data},
              {"usage", {{"prompt_tokens", total}, {"total_tokens", total}, {"completion_tokens", 0},
                         {"prompt_tokens_details", nullptr}}}}
             .dump();
  return std::nullopt;
}

std::optional<SimError> sim_render_chat(const json& body, const AuxContext& ctx, std::string* out) {
  GenerationRequest req;
  if (auto e = parse_generation_request(ApiKind::kChat, body, ctx.served_model, &req)) return e;
  *out = render_object(req, image_parts(body["messages"]), ctx).dump();
  return std::nullopt;
}

std::optional<SimError> sim_render_completions(const json& body, const AuxContext& ctx, std::string* out) {
  GenerationRequest req;
  if (auto e = parse_generation_request(ApiKind::kCompletion, body, ctx.served_model, &req)) return e;
  json object = render_object(req, {}, ctx);
  const json& prompt = body["prompt"];
  if (prompt.is_array() && !prompt.empty() && prompt[0].is_number_integer()) object["token_ids"] = prompt;
  *out = json::array({std::move(object)}).dump();
  return std::nullopt;
}

}  // namespace pdr::node::sim
