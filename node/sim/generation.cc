#include "node/sim/generation.h"

#include <array>
#include <cstdio>
#include <string_view>

namespace pdr::node::sim {
namespace {

using nlohmann::json;

constexpr std::array<std::string_view, 32> kVocabulary = {
    "the",   "quick", "brown",  "fox",    "jumps", "over",  "lazy",   "dog",
    "prefill", "decode", "cache", "block", "token", "model", "router", "node",
    "alpha", "beta",  "gamma",  "delta",  "sigma", "omega", "kappa",  "zeta",
    "red",   "green", "blue",   "amber",  "north", "south", "east",   "west"};

uint64_t fnv1a(std::string_view text, uint64_t hash = 1469598103934665603ULL) {
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return hash;
}

uint32_t count_words(std::string_view text) {
  uint32_t words = 0;
  bool in_word = false;
  for (char c : text) {
    const bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    if (!space && !in_word) ++words;
    in_word = !space;
  }
  return words;
}

SimError bad_request(std::string reason, std::string message) {
  return SimError{400, std::move(reason), std::move(message)};
}

// Completions accept a string, a list of strings (we take the first prompt, as the simulator
// answers one choice), a token-id list, or a list of token-id lists.
std::optional<SimError> read_prompt(const json& prompt, GenerationRequest* out) {
  if (prompt.is_string()) {
    out->prompt_text = prompt.get<std::string>();
    out->prompt_tokens = count_words(out->prompt_text);
    return std::nullopt;
  }
  if (prompt.is_array() && !prompt.empty()) {
    if (prompt[0].is_string()) return read_prompt(prompt[0], out);
    if (prompt[0].is_array()) return read_prompt(prompt[0], out);
    bool all_ints = true;
    for (const json& item : prompt) all_ints = all_ints && item.is_number_integer();
    if (all_ints) {
      out->prompt_text = prompt.dump();
      out->prompt_tokens = static_cast<uint32_t>(prompt.size());
      return std::nullopt;
    }
  }
  return bad_request("bad_prompt", "prompt must be a string, a list of strings or token ids");
}

std::optional<SimError> read_messages(const json& messages, GenerationRequest* out) {
  if (!messages.is_array() || messages.empty()) {
    return bad_request("bad_messages", "messages must be a non-empty list");
  }
  for (const json& message : messages) {
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string()) {
      return bad_request("bad_messages", "each message needs a string 'role'");
    }
    const json content = message.value("content", json());
    out->prompt_text += message["role"].get<std::string>();
    out->prompt_text += ": ";
    if (content.is_string()) {
      out->prompt_text += content.get<std::string>();
    } else if (content.is_array()) {  // [{type:"text", text:...}, ...]
      for (const json& part : content) {
        if (part.is_object() && part.contains("text") && part["text"].is_string()) {
          out->prompt_text += part["text"].get<std::string>();
          out->prompt_text += ' ';
        }
      }
    }
    out->prompt_text += '\n';
    out->prompt_tokens += count_words(content.is_string() ? content.get<std::string>()
                                                          : std::string());
    if (content.is_array()) {
      for (const json& part : content) {
        if (part.is_object() && part.contains("text") && part["text"].is_string()) {
          out->prompt_tokens += count_words(part["text"].get<std::string>());
        }
      }
    }
  }
  return std::nullopt;
}

std::optional<SimError> read_max_tokens(const json& body, GenerationRequest* out) {
  out->max_tokens = kDefaultMaxTokens;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!body.contains(key) || body[key].is_null()) continue;
    const json& value = body[key];
    if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > 1000000) {
      return bad_request("bad_max_tokens", std::string(key) + " must be an integer >= 1");
    }
    out->max_tokens = static_cast<uint32_t>(value.get<int64_t>());  // the later key wins
  }
  return std::nullopt;
}

// /v1/responses: `input` is a string or a list of items; message items ({role, content}) count
// like chat messages, other items (function outputs, ...) add nothing.
std::optional<SimError> read_responses_input(const json& body, GenerationRequest* out) {
  if (!body.contains("input")) return bad_request("bad_input", "input is required");
  const json& input = body["input"];
  if (input.is_string()) {
    out->prompt_text = input.get<std::string>();
    out->prompt_tokens = count_words(out->prompt_text);
    return std::nullopt;
  }
  if (!input.is_array() || input.empty()) {
    return bad_request("bad_input", "input must be a string or a non-empty list of items");
  }
  out->prompt_tokens = 0;
  json messages = json::array();
  for (const json& item : input) {
    if (item.is_object() && item.contains("role")) messages.push_back(item);
  }
  if (messages.empty()) return std::nullopt;
  return read_messages(messages, out);
}

std::optional<SimError> read_max_output_tokens(const json& body, GenerationRequest* out) {
  out->max_tokens = kDefaultMaxTokens;
  if (!body.contains("max_output_tokens") || body["max_output_tokens"].is_null()) return std::nullopt;
  const json& value = body["max_output_tokens"];
  if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > 1000000) {
    return bad_request("bad_max_output_tokens", "max_output_tokens must be an integer >= 1");
  }
  out->max_tokens = static_cast<uint32_t>(value.get<int64_t>());
  return std::nullopt;
}

// Anthropic's /v1/messages (vLLM's AnthropicMessagesRequest): `system` (a string or text blocks)
// is read before the messages, whose items are chat-like {role, content: a string or blocks};
// max_tokens is required, an integer > 0.
std::optional<SimError> read_anthropic(const json& body, GenerationRequest* out) {
  out->prompt_tokens = 0;
  if (body.contains("system") && !body["system"].is_null()) {
    json system = json::array({json{{"role", "system"}, {"content", body["system"]}}});
    if (auto e = read_messages(system, out)) return e;
  }
  if (!body.contains("messages")) return bad_request("bad_messages", "messages is required");
  if (auto e = read_messages(body["messages"], out)) return e;
  // Only max_tokens: max_completion_tokens is no field of this API (vLLM ignores it).
  const json max_tokens = body.value("max_tokens", json());
  if (!max_tokens.is_number_integer() || max_tokens.get<int64_t>() < 1 || max_tokens.get<int64_t>() > 1000000) {
    return bad_request("bad_max_tokens", "max_tokens is required and must be an integer >= 1");
  }
  out->max_tokens = static_cast<uint32_t>(max_tokens.get<int64_t>());
  return std::nullopt;
}

json base_object(const GenerationRequest& req, const std::string& id, int64_t created,
                 const char* object) {
  if (req.kind == ApiKind::kGenerate) return json{{"request_id", id}};
  return json{{"id", id}, {"object", object}, {"created", created}, {"model", req.model}};
}

// vLLM's GenerateRequest: token_ids, sampling_params (max_tokens inside), and the KV parameters
// the engine reads from sampling_params.extra_args (the top level as a fallback here).
std::optional<SimError> read_generate(const json& body, GenerationRequest* out) {
  if (!body.contains("token_ids") || !body["token_ids"].is_array() || body["token_ids"].empty()) {
    return bad_request("bad_token_ids", "token_ids must be a non-empty list of token ids");
  }
  for (const json& id : body["token_ids"]) {
    if (!id.is_number_unsigned()) {
      return bad_request("bad_token_ids", "token_ids must hold non-negative integers, got " + id.dump());
    }
  }
  out->prompt_text = body["token_ids"].dump();
  out->prompt_tokens = static_cast<uint32_t>(body["token_ids"].size());
  if (!body.contains("sampling_params") || !body["sampling_params"].is_object()) {
    return bad_request("bad_sampling_params", "sampling_params is required and must be an object");
  }
  const json& sp = body["sampling_params"];
  if (auto e = read_max_tokens(sp, out)) return e;
  json top = body.contains("kv_transfer_params") ? body["kv_transfer_params"] : json();
  json nested;
  if (sp.contains("extra_args") && sp["extra_args"].is_object() && sp["extra_args"].contains("kv_transfer_params")) {
    nested = sp["extra_args"]["kv_transfer_params"];
  }
  if (!top.is_null() && !nested.is_null() && top != nested) {
    return bad_request("bad_kv_transfer_params",
                       "kv_transfer_params differ between the top level and sampling_params.extra_args");
  }
  out->kv_transfer_params = nested.is_null() ? top : nested;
  return std::nullopt;
}

json usage_json(const GenerationRequest& req, uint32_t completion_tokens) {
  return json{{"prompt_tokens", req.prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", req.prompt_tokens + completion_tokens}};
}

std::string sse(const json& chunk) { return "data: " + chunk.dump() + "\n\n"; }

const char* chunk_object(const GenerationRequest& req) {
  return req.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion";
}

}  // namespace

std::string_view sim_vocabulary_word(size_t index) { return kVocabulary[index % kVocabulary.size()]; }

uint64_t sim_fnv1a(std::string_view text, uint64_t hash) { return fnv1a(text, hash); }

std::optional<SimError> parse_generation_request(ApiKind kind, const json& body,
                                                 const std::string& served_model,
                                                 GenerationRequest* out) {
  if (!body.is_object()) return bad_request("bad_json", "request body must be a JSON object");
  out->kind = kind;
  out->model = served_model;
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) return bad_request("bad_model", "model must be a string");
    if (body["model"].get<std::string>() != served_model) {
      return SimError{404, "model_not_found",
                      "The model `" + body["model"].get<std::string>() + "` does not exist."};
    }
  }
  if (kind == ApiKind::kGenerate) {
    if (auto e = read_generate(body, out)) return e;
  } else if (kind == ApiKind::kCompletion) {
    if (!body.contains("prompt")) return bad_request("bad_prompt", "prompt is required");
    if (auto e = read_prompt(body["prompt"], out)) return e;
  } else if (kind == ApiKind::kResponses) {
    if (auto e = read_responses_input(body, out)) return e;
  } else if (kind == ApiKind::kMessages) {
    if (!body.contains("model") || body["model"].is_null()) return bad_request("bad_model", "model is required");
    if (auto e = read_anthropic(body, out)) return e;
  } else {
    out->prompt_tokens = 0;
    if (!body.contains("messages")) return bad_request("bad_messages", "messages is required");
    if (auto e = read_messages(body["messages"], out)) return e;
  }
  if (out->prompt_tokens == 0) out->prompt_tokens = 1;
  if (kind == ApiKind::kResponses) {
    if (auto e = read_max_output_tokens(body, out)) return e;
  } else if (kind != ApiKind::kGenerate && kind != ApiKind::kMessages) {
    if (auto e = read_max_tokens(body, out)) return e;
  }
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return bad_request("bad_stream", "stream must be a boolean");
    out->stream = body["stream"].get<bool>();
  }
  // (Not a field of Anthropic's API: vLLM asks its chat stream for usage itself.)
  if (kind != ApiKind::kMessages && body.contains("stream_options") && body["stream_options"].is_object()) {
    const json& options = body["stream_options"];
    if (!out->stream) {
      return bad_request("bad_stream_options", "Stream options can only be defined when `stream=True`.");
    }
    out->include_usage = options.value("include_usage", false) == true;
  }
  return std::nullopt;
}

std::vector<std::string> generate_tokens(const std::string& request_id,
                                         const std::string& prompt_text, uint32_t count) {
  const uint64_t seed = fnv1a(prompt_text, fnv1a(request_id) ^ 0x5bd1e995ULL);
  std::vector<std::string> tokens;
  tokens.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t h = fnv1a(std::to_string(i), seed);
    tokens.push_back(" " + std::string(kVocabulary[h % kVocabulary.size()]));
  }
  return tokens;
}

int64_t generated_token_id(const std::string& token) {
  const std::string_view word = std::string_view(token).substr(token.starts_with(' ') ? 1 : 0);
  for (size_t i = 0; i < kVocabulary.size(); ++i) {
    if (kVocabulary[i] == word) return static_cast<int64_t>(i);
  }
  return 0;  // generate_tokens only makes vocabulary words
}

std::string response_id(ApiKind kind, const std::string& request_id) {
  if (kind == ApiKind::kGenerate) return "generate-tokens-" + request_id;
  if (kind == ApiKind::kResponses) return "resp_" + request_id;
  return (kind == ApiKind::kChat || kind == ApiKind::kMessages ? "chatcmpl-" : "cmpl-") + request_id;
}

std::string internal_request_id(ApiKind kind, const std::string& request_id) {
  char suffix[9];
  std::snprintf(suffix, sizeof(suffix), "%08x", static_cast<uint32_t>(fnv1a(request_id)));
  if (kind == ApiKind::kGenerate) return "generate-tokens-" + request_id + "-" + suffix;
  if (kind == ApiKind::kResponses) return "resp_" + request_id + "_0-" + suffix;
  return kind == ApiKind::kChat || kind == ApiKind::kMessages ? "chatcmpl-" + request_id + "-" + suffix
                                                              : "cmpl-" + request_id + "-0-" + suffix;
}

std::string full_response(const GenerationRequest& req, const std::string& id, int64_t created,
                          const std::vector<std::string>& tokens, const std::string& finish_reason,
                          const json& kv_params) {
  std::string text;
  for (const std::string& t : tokens) text += t;
  json choice{{"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}};
  json body;
  if (req.kind == ApiKind::kGenerate) {
    body = base_object(req, id, created, nullptr);
    json ids = json::array();
    for (const std::string& t : tokens) ids.push_back(generated_token_id(t));
    choice["token_ids"] = ids;
    body["prompt_logprobs"] = nullptr;
  } else if (req.kind == ApiKind::kChat) {
    body = base_object(req, id, created, "chat.completion");
    choice["message"] = json{{"role", "assistant"}, {"content", text}};
  } else {
    body = base_object(req, id, created, "text_completion");
    choice["text"] = text;
  }
  body["choices"] = json::array({choice});
  body["usage"] = usage_json(req, static_cast<uint32_t>(tokens.size()));
  body["kv_transfer_params"] = kv_params;
  return body.dump();
}

std::string sse_role_chunk(const GenerationRequest& req, const std::string& id, int64_t created) {
  json chunk = base_object(req, id, created, chunk_object(req));
  chunk["choices"] = json::array({json{{"index", 0},
                                       {"delta", {{"role", "assistant"}, {"content", ""}}},
                                       {"logprobs", nullptr},
                                       {"finish_reason", nullptr}}});
  if (req.include_usage) chunk["usage"] = nullptr;
  return sse(chunk);
}

std::string sse_token_chunk(const GenerationRequest& req, const std::string& id, int64_t created,
                            const std::string& token, const std::string* finish_reason) {
  json chunk = base_object(req, id, created, chunk_object(req));
  json choice{{"index", 0}, {"logprobs", nullptr}};
  if (req.kind == ApiKind::kGenerate) {
    choice["token_ids"] = json::array({generated_token_id(token)});
  } else if (req.kind == ApiKind::kChat) {
    choice["delta"] = json{{"content", token}};
  } else {
    choice["text"] = token;
  }
  choice["finish_reason"] = finish_reason ? json(*finish_reason) : json(nullptr);
  chunk["choices"] = json::array({choice});
  if (req.include_usage) chunk["usage"] = nullptr;
  return sse(chunk);
}

std::string sse_kv_params_chunk(const GenerationRequest& req, const std::string& id, int64_t created,
                                const json& kv_params) {
  json chunk = base_object(req, id, created, chunk_object(req));
  chunk["choices"] = json::array();
  chunk["kv_transfer_params"] = kv_params;
  return sse(chunk);
}

std::string sse_usage_chunk(const GenerationRequest& req, const std::string& id, int64_t created,
                            uint32_t completion_tokens) {
  json chunk = base_object(req, id, created, chunk_object(req));
  chunk["choices"] = json::array();
  chunk["usage"] = usage_json(req, completion_tokens);
  return sse(chunk);
}

}  // namespace pdr::node::sim
