#include "router/proxy/client_api.h"

#include "router/http/json_error.h"
#include "proto/anthropic_messages.h"

namespace pdr::router::proxy {

http::Response api_error_response(std::string_view path, int status, std::string_view message,
                                  std::string_view type, std::string_view code) {
  if (proto::is_anthropic_path(path)) return http::Response::json(status, proto::anthropic_error_body(status, message));
  return http::error_response(status, message, type, code);
}

std::string client_authorization(const http::Request& request) {
  if (auto authorization = request.header("Authorization")) return std::string(*authorization);
  if (!proto::is_anthropic_path(request.path)) return {};
  const auto key = request.header("x-api-key");
  if (!key || key->empty()) return {};
  return "Bearer " + std::string(*key);
}

void strip_client_credentials(http::Request& request) {
  std::erase_if(request.headers, [](const http::Header& h) {
    return http::iequals(h.name, "Authorization") || http::iequals(h.name, "x-api-key");
  });
}

}  // namespace pdr::router::proxy
