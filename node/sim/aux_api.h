// The simulated vLLM node's endpoints that generate nothing: POST /tokenize, POST /detokenize,
// POST /v1/embeddings, POST /v1/chat/completions/render and POST /v1/completions/render. Pure
// functions from a parsed body to vLLM's answer body (no I/O, no clocks: `created` comes in).
//
// Token model (the same words as generation.h counts, the same ids as the prefix cache
// hashes, prompt_tokens.h): a text's tokens are its whitespace-separated words; a word of the
// sim's fixed vocabulary (sim_vocabulary()) has its index there as id, any other word an id in
// [1000, 32000) (word_token_id). /tokenize of chat messages answers the ids of the messages' text
// (what the prefix cache hashes for a chat request). /detokenize maps ids below 32 back to their
// word and any other id to "<id>", joined by spaces, so a text made of vocabulary words survives
// a /tokenize -> /detokenize round trip.
//
// Answer shapes (vLLM's serving_tokenization and render endpoints; docs/design/wire-formats.md section 8):
//   /tokenize      {"count","max_model_len","tokens",["token_strs" when return_token_strs]}
//   /detokenize    {"prompt"}
//   /v1/embeddings {"id":"embd-...","object":"list","created","model","data":[{"index",
//                   "object":"embedding","embedding":[8 floats]}],"usage":{...}}
//   chat render    {"request_id","token_ids","features","sampling_params","model",
//                   "kv_transfer_params":null}; features is null without image parts, else
//                   {"mm_hashes":{"image":[...]},"mm_placeholders":{"image":[{"offset","length"}]},
//                   "kwargs_data":{"image":[base64 of feature_bytes fake bytes per image]}}
//   completions render: a one-element array of that object, features null.
// A fake feature blob is deterministic (derived from the image part's URL), so `feature_bytes`
// (pdnode sim --render-feature-bytes) makes a render answer as large as a test needs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim/error.h"

namespace pdr::node::sim {

struct AuxContext {
  std::string served_model;
  uint32_t max_model_len = 8192;
  uint32_t feature_bytes = 0;  // raw bytes of one image's fake features (base64 in the answer)
  std::string request_id;      // X-Request-Id or generated
  int64_t created = 0;
};

// Each returns the answer body, or the refusal (400 for a malformed body, 404 for another model).
std::optional<SimError> sim_tokenize(const nlohmann::json& body, const AuxContext& ctx, std::string* out);
std::optional<SimError> sim_detokenize(const nlohmann::json& body, const AuxContext& ctx, std::string* out);
std::optional<SimError> sim_embeddings(const nlohmann::json& body, const AuxContext& ctx, std::string* out);
std::optional<SimError> sim_render_chat(const nlohmann::json& body, const AuxContext& ctx, std::string* out);
std::optional<SimError> sim_render_completions(const nlohmann::json& body, const AuxContext& ctx,
                                               std::string* out);

// The token ids of `text` under the token model above.
std::vector<int64_t> sim_token_ids(std::string_view text);

}  // namespace pdr::node::sim
