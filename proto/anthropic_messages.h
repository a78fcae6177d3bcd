// Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens) as vLLM serves it
// and pdrouter splits it.
//
// vLLM (vllm/entrypoints/anthropic/: protocol.py, serving.py, api_router.py) turns a Messages
// request into a chat completion: max_tokens (required, an int > 0) caps it, stream (a bool or
// null) asks for named SSE events (message_start, content_block_start, content_block_delta,
// content_block_stop, message_delta, message_stop; Anthropic's own API also sends ping), and
// since vllm-project/vllm#37535 the request takes kv_transfer_params, which reach the engine as on
// chat, and a non-streamed answer carries the engine's at its top level (dropped when null). So
// the dialects build the legs exactly as for chat: the prefill gets max_tokens 1 and stream false
// (the field names are chat's), the decode the client's body plus the dialect's parameters, and
// MoRIIO's decode decrement reads max_tokens as on chat. A client's max_completion_tokens (no
// field of this API; vLLM ignores it) is dropped from both legs, so that no dialect edits it in
// place of max_tokens. A streamed answer carries no kv_transfer_params (vLLM's stream converter
// does not write them).
//
// pdrouter's own refusals and failures on these paths are Anthropic's error shape
// ({"type":"error","error":{"type":...,"message":...}}, one error type per HTTP status, as
// Anthropic's API documents them), and a stream that fails after it began ends with an
// `event: error` event of that shape (Anthropic's streams have no [DONE]).
//
// Pure; no I/O.
#pragma once

#include <string>
#include <string_view>

#include "proto/base/status.h"
#include "proto/json_splice.h"

namespace pdr::proto {

inline constexpr std::string_view kMessagesPath = "/v1/messages";
inline constexpr std::string_view kMessagesCountTokensPath = "/v1/messages/count_tokens";

// The paths whose clients speak Anthropic's API (errors, credentials): both above.
bool is_anthropic_path(std::string_view path);

// What pdrouter refuses itself before any leg of a Messages request (vLLM would refuse each on
// the prefill, after the router paired and sent it):
//   model       required, a non-empty string
//   messages    required, a non-empty array
//   max_tokens  required, an integer >= 1 (not null: Anthropic's API and vLLM both require it)
//   stream      a boolean or null
// Errors name the field: kMissingKey, kWrongType, kOutOfRange (an integer outside int64),
// kInvalidValue.
Status check_messages_request(const JsonObjectBody& body);

// Anthropic's error type for an HTTP status: 400 invalid_request_error, 401
// authentication_error, 402 billing_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 503 and 529 overloaded_error, 504 timeout_error, any
// other 4xx invalid_request_error, anything else api_error.
std::string_view anthropic_error_type(int status);

// {"type":"error","error":{"type":anthropic_error_type(status),"message":<message>}}.
std::string anthropic_error_body(int status, std::string_view message);

// The same as one SSE event: "event: error\ndata: <body>\n\n".
std::string anthropic_error_event(int status, std::string_view message);

}  // namespace pdr::proto
