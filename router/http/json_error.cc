#include "router/http/json_error.h"

#include "proto/json_splice.h"

namespace pdr::http {

std::string error_body(std::string_view message, std::string_view type, std::string_view code) {
  std::string out;
  out.reserve(48 + message.size() + type.size() + code.size());
  out += "{\"error\":{\"message\":";
  proto::append_json_string(out, message);
  out += ",\"type\":";
  proto::append_json_string(out, type);
  out += ",\"code\":";
  if (code.empty()) {
    out += "null";
  } else {
    proto::append_json_string(out, code);
  }
  out += "}}";
  return out;
}

Response error_response(int status, std::string_view message, std::string_view type,
                        std::string_view code) {
  return Response::json(status, error_body(message, type, code));
}

}  // namespace pdr::http
