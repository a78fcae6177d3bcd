#include "proto/base/status.h"

namespace pdr {

std::string_view code_label(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kMalformed: return "malformed";
    case StatusCode::kTooLarge: return "too_large";
    case StatusCode::kTooDeep: return "too_deep";
    case StatusCode::kMissingKey: return "missing_key";
    case StatusCode::kWrongType: return "wrong_type";
    case StatusCode::kBadAddress: return "bad_address";
    case StatusCode::kOutOfRange: return "out_of_range";
    case StatusCode::kInvalidValue: return "invalid_value";
    case StatusCode::kUnknownType: return "unknown_type";
    case StatusCode::kUnauthenticated: return "unauthenticated";
    case StatusCode::kRejected: return "rejected";
    case StatusCode::kNotFound: return "not_found";
    case StatusCode::kIoError: return "io_error";
    case StatusCode::kInternal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  std::string out(code_label(code_));
  out += ": ";
  out += message_;
  return out;
}

}  // namespace pdr
