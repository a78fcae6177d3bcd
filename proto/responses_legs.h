// The Responses API (POST /v1/responses) through the P/D legs.
//
// vLLM accepts kv_transfer_params on /v1/responses since vllm-project/vllm#37424 (merged
// 2026-03; vllm/entrypoints/openai/responses/protocol.py: ResponsesRequest.kv_transfer_params is
// put in SamplingParams.extra_args as on chat, and ResponsesResponse carries the engine's
// kv_transfer_params at top level, the same place as a chat answer). So the dialects build the
// legs as for chat, and this file respells what differs: the Responses API caps generation with
// `max_output_tokens` (a `max_tokens` member is an extra field vLLM ignores, so a prefill capped
// with it would generate the whole answer).
//
// Prefill (when the dialect capped it, i.e. every dialect but SGLang, whose single body is not
// capped): `max_output_tokens: 1` instead of `max_tokens: 1` (a client's own max_tokens is
// dropped from the prefill too), `store: false` (nothing of a one-token prefill answer is worth
// storing on the prefill node) and no `background` (vLLM answers a background request at once,
// with status "queued" and no kv_transfer_params).
// Decode: the client's body with the dialect's edits, as for chat. Not done: MoRIIO's decode
// decrement (-1 token) reads max_tokens / max_completion_tokens, so a MoRIIO responses decode is
// not decremented (it may produce one token more than max_output_tokens).
#pragma once

#include <string_view>

#include "proto/base/status.h"
#include "proto/json_splice.h"

namespace pdr::proto {

inline constexpr std::string_view kResponsesPath = "/v1/responses";

// kWrongType when the client's max_output_tokens is neither an integer nor null (vLLM's 400).
Status check_responses_fields(const JsonObjectBody& client);

// Respells the dialect's prefill cap for the Responses API (see above). `client` is the client's
// body the legs were copied from.
void respell_prefill_for_responses(const JsonObjectBody& client, JsonObjectBody* prefill);

}  // namespace pdr::proto
