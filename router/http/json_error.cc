#include "router/http/json_error.h"

namespace pdr::http {

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += "\\u00";
          out.push_back(kHex[u >> 4]);
          out.push_back(kHex[u & 0xf]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

std::string error_body(std::string_view message, std::string_view type, std::string_view code) {
  std::string out;
  out.reserve(48 + message.size() + type.size() + code.size());
  out += "{\"error\":{\"message\":";
  append_json_string(out, message);
  out += ",\"type\":";
  append_json_string(out, type);
  out += ",\"code\":";
  if (code.empty()) {
    out += "null";
  } else {
    append_json_string(out, code);
  }
  out += "}}";
  return out;
}

Response error_response(int status, std::string_view message, std::string_view type,
                        std::string_view code) {
  return Response::json(status, error_body(message, type, code));
}

}  // namespace pdr::http
