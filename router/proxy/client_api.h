// What differs at pdrouter's edge between the client APIs it serves: OpenAI's (every path but
// Anthropic's) and Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens,
// proto/anthropic_messages.h). Two things:
//  - pdrouter's own error answers on a path: OpenAI-style {"error":{"message","type","code"}}
//    (router/http/json_error.h), or Anthropic's {"type":"error","error":{"type","message"}} with the
//    error type of the status (its `code` is not part of Anthropic's shape and is dropped; the
//    message says what happened).
//  - the client's credential forwarded to the nodes: its Authorization header; Anthropic's SDKs
//    send the key as `x-api-key` instead, which vLLM's --api-key check does not read (it reads
//    `Authorization: Bearer` only, vllm/entrypoints/serve/middleware/authenticate.py), so on the
//    Anthropic paths a client without Authorization has its x-api-key forwarded as
//    "Bearer <key>". `anthropic-version` is not forwarded: vLLM reads no version header.
#pragma once

#include <string>
#include <string_view>

#include "router/http/http_message.h"

namespace pdr::router::proxy {

// pdrouter's error answer `status` on `path`. `type` and `code` are the OpenAI shape's (ignored
// on Anthropic's paths, whose type follows from the status).
http::Response api_error_response(std::string_view path, int status, std::string_view message,
                                  std::string_view type, std::string_view code);

// The client's credential for the nodes (see above): its Authorization value, else on an
// Anthropic path "Bearer <x-api-key>", else "".
std::string client_authorization(const http::Request& request);

// Removes the client's credential headers (Authorization, x-api-key) from `request`: what is
// relayed of it afterwards carries none (a client key for pdrouter is not one for the nodes:
// router/clients/client_gate.h).
void strip_client_credentials(http::Request& request);

}  // namespace pdr::router::proxy
