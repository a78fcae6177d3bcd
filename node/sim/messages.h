// vLLM's shapes of Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens)
// for `pdnode sim`. Pure functions, as generation.h.
//
// Shapes (vllm/entrypoints/anthropic/protocol.py, serving.py, api_router.py). vLLM serves a
// Messages request as a chat completion and converts the answer:
//  - non-streamed: {id (the chat id, "chatcmpl-<X-Request-Id>"), type "message", role
//    "assistant", content [{type "text", text}], model, stop_reason ("max_tokens" when max_tokens
//    ended it, else "end_turn"), usage {input_tokens, output_tokens}, kv_transfer_params (since
//    vllm-project/vllm#37535; left out when null, as vLLM dumps without None)};
//  - streamed: named SSE events "event: <type>\ndata: <json with the same type>\n\n":
//    message_start (the message with empty content and usage {input_tokens, output_tokens 0}),
//    content_block_start (index 0, a text block), ping (Anthropic's API sends one early; vLLM
//    does not, the sim does so relays see one), one content_block_delta (text_delta) per token,
//    content_block_stop, message_delta ({delta {stop_reason}, usage}), message_stop. No [DONE],
//    and no kv_transfer_params (vLLM's stream converter drops them);
//  - errors: {"type":"error","error":{"type":<vLLM's error type: BadRequestError, NotFoundError,
//    InternalServerError>,"message"}} with the status; mid-stream, an `event: error` with
//    {"type":"error","error":{"type":"internal_error","message"}} (vLLM's converter on a failed
//    chat stream).
//  - count_tokens: {input_tokens, context_management {original_input_tokens}}: the prompt's token
//    count (generation.h's word count of `system` and the messages).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim/aux_api.h"
#include "node/sim/error.h"
#include "node/sim/generation.h"

namespace pdr::node::sim {

inline constexpr std::string_view kSimMessagesPath = "/v1/messages";
inline constexpr std::string_view kSimCountTokensPath = "/v1/messages/count_tokens";

std::string messages_full(const GenerationRequest& req, const std::string& id, const std::vector<std::string>& tokens,
                          bool stopped, const nlohmann::json& kv_params);

// The events before the first token: message_start, content_block_start, ping.
std::string messages_open_events(const GenerationRequest& req, const std::string& id);
std::string messages_delta_event(const std::string& token);
// The events after the last token.
std::string messages_close_events(const GenerationRequest& req, size_t output_tokens, bool stopped);

// The error body of `error` on `path`: the Anthropic shape above on the Messages paths, vLLM's
// OpenAI error (vllm_error_body) on any other.
std::string sim_error_body(std::string_view path, const SimError& error);
// A streamed Messages answer failing: one `event: error` (see above).
std::string messages_error_event(const SimError& error);

// POST /v1/messages/count_tokens: the answer body, or the refusal (400 for a malformed body, 404
// for another model).
std::optional<SimError> sim_count_tokens(const nlohmann::json& body, const AuxContext& ctx, std::string* out);

}  // namespace pdr::node::sim
