// Deterministic generation for `pdnode sim`: request parsing (prompt -> token count, max_tokens,
// stream flags), the generated tokens, and vLLM's JSON / SSE response shapes. No I/O, no clocks:
// the server passes `created` in.
//
// Token model (documented for tests): a prompt's token count is its number of whitespace-separated
// words (a prompt given as a token-id array counts its ids; chat counts the words of every message's
// text content); at least 1. Generated token i is " " + a word from a fixed vocabulary picked by
// FNV-1a over (request id, prompt text, i), so the same X-Request-Id and prompt always produce the
// same text, on any node and in stream or non-stream form.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim/error.h"

namespace pdr::node::sim {

// kGenerate: vLLM's tokens-in POST /inference/v1/generate ({token_ids, sampling_params{...},
// stream?}); its answers carry token ids (the vocabulary index of each generated word, as
// aux_api.h's /detokenize reads them) instead of text.
// kResponses: POST /v1/responses (its shapes are in responses.h).
// kMessages: Anthropic's POST /v1/messages as vLLM serves it (messages.h): chat underneath
// (its ids are chat's), `system` counted before the messages, max_tokens required.
enum class ApiKind { kCompletion, kChat, kGenerate, kResponses, kMessages };

struct GenerationRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;         // as requested (echoed back)
  std::string prompt_text;   // what the tokens are derived from
  uint32_t prompt_tokens = 1;
  uint32_t max_tokens = 16;  // max_completion_tokens wins over max_tokens; default 16
                             // (kResponses: max_output_tokens; max_tokens is ignored, as vLLM does;
                             // kMessages: max_tokens, required)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // kGenerate: the kv_transfer_params the engine gets, from sampling_params.extra_args (where
  // vLLM's generate handler passes them), else from the top level; null when neither has them.
  nlohmann::json kv_transfer_params;
};

constexpr uint32_t kDefaultMaxTokens = 16;

// Validates the fields vLLM validates (prompt / messages / input present, max_tokens >= 1 and an
// int, stream a bool; for kGenerate token_ids an array of non-negative ints, sampling_params an
// object holding max_tokens, and kv_transfer_params that agree where both places have them).
// `served_model` is what an absent "model" defaults to; a different model name is
// refused with 404 as vLLM does.
std::optional<SimError> parse_generation_request(ApiKind kind, const nlohmann::json& body,
                                                 const std::string& served_model,
                                                 GenerationRequest* out);

// The fixed vocabulary generated tokens come from (32 words), and the FNV-1a hash used to pick
// them; aux_api.h's token ids reuse both.
std::string_view sim_vocabulary_word(size_t index);  // index < kSimVocabularySize
inline constexpr size_t kSimVocabularySize = 32;
uint64_t sim_fnv1a(std::string_view text, uint64_t hash = 1469598103934665603ULL);

// The token id of a generated token (" word"): the word's vocabulary index.
int64_t generated_token_id(const std::string& token);

std::vector<std::string> generate_tokens(const std::string& request_id,
                                         const std::string& prompt_text, uint32_t count);

// "cmpl-<id>" / "chatcmpl-<id>" / "generate-tokens-<id>", vLLM's user-visible response id for
// X-Request-Id <id> (kMessages: chat's, which vLLM's Messages answer carries as its id).
std::string response_id(ApiKind kind, const std::string& request_id);

// The engine-internal id vLLM derives from it (docs/design/wire-formats.md 5): "cmpl-<id>-0-<8hex>" or
// "chatcmpl-<id>-<8hex>" (generate: "generate-tokens-<id>-<8hex>"), the 8 hex digits derived
// from the id so they are reproducible.
std::string internal_request_id(ApiKind kind, const std::string& request_id);

// Non-streaming body: CompletionResponse / ChatCompletionResponse with usage and a top-level
// kv_transfer_params (null when `kv_params` is null); for kGenerate vLLM's GenerateResponse
// {request_id, choices[{index, logprobs, finish_reason, token_ids}], usage, kv_transfer_params}.
std::string full_response(const GenerationRequest& req, const std::string& id, int64_t created,
                          const std::vector<std::string>& tokens, const std::string& finish_reason,
                          const nlohmann::json& kv_params);

// SSE events, each "data: {...}\n\n". Chat streams open with a role-only delta. A token chunk
// carries finish_reason only on the last token; with include_usage every chunk has "usage": null
// and a final choices-less chunk carries the usage. kGenerate chunks are
// {request_id, choices[{index, logprobs, finish_reason, token_ids}]}.
std::string sse_role_chunk(const GenerationRequest& req, const std::string& id, int64_t created);
std::string sse_token_chunk(const GenerationRequest& req, const std::string& id, int64_t created,
                            const std::string& token, const std::string* finish_reason);
// A last chunk with no choices carrying the decode's kv_transfer_params (vLLM's streamed
// kv_transfer_params for bidirectional NIXL).
std::string sse_kv_params_chunk(const GenerationRequest& req, const std::string& id, int64_t created,
                                const nlohmann::json& kv_params);
std::string sse_usage_chunk(const GenerationRequest& req, const std::string& id, int64_t created,
                            uint32_t completion_tokens);
inline constexpr const char* kSseDone = "data: [DONE]\n\n";

}  // namespace pdr::node::sim
