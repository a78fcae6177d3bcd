// OpenAI-style error bodies: {"error":{"message":...,"type":...,"code":...}}.
//
// Every error the server itself produces (400, 408, 413, 431, 500) uses this shape, so clients
// written against the OpenAI API parse router errors the same way as model-server errors.
#pragma once

#include <string>
#include <string_view>

#include "router/http/http_message.h"

namespace pdr::http {

// The JSON body alone. An empty `code` is written as null.
std::string error_body(std::string_view message, std::string_view type, std::string_view code);

// Response with the body above and Content-Type: application/json.
Response error_response(int status, std::string_view message, std::string_view type,
                        std::string_view code);

}  // namespace pdr::http
