// vLLM's Responses API shapes (POST /v1/responses) for `pdnode sim`: the non-streamed
// ResponsesResponse and the streamed events. Pure functions, as generation.h.
//
// Shapes (vllm/entrypoints/openai/responses/protocol.py, serving.py, api_router.py): a response
// object {id "resp_<X-Request-Id>", object "response", created_at, model, status "completed" (or
// "incomplete" when max_output_tokens ended it), output [one message item with one output_text
// part], max_output_tokens, usage {input_tokens, output_tokens, total_tokens, *_details}, and
// kv_transfer_params (vllm-project/vllm#37424) at top level}. A stream is named SSE events,
// "event: <type>\ndata: <json with the same type and a sequence_number>\n\n", in this order:
// response.created, response.in_progress, response.output_item.added,
// response.content_part.added, one response.output_text.delta per token,
// response.output_text.done, response.content_part.done, response.output_item.done,
// response.completed (its response object carries kv_transfer_params). No "data: [DONE]".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/sim/generation.h"

namespace pdr::node::sim {

std::string responses_full(const GenerationRequest& req, const std::string& id, int64_t created,
                           const std::vector<std::string>& tokens, bool stopped,
                           const nlohmann::json& kv_params);

// The events before the first token (sequence numbers 0..3).
std::string responses_open_events(const GenerationRequest& req, const std::string& id, int64_t created);
// Token `index` (0-based).
std::string responses_delta_event(const std::string& id, const std::string& token, size_t index);
// The events after the last token.
std::string responses_close_events(const GenerationRequest& req, const std::string& id, int64_t created,
                                   const std::vector<std::string>& tokens, bool stopped,
                                   const nlohmann::json& kv_params);

}  // namespace pdr::node::sim
