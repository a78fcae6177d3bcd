// Status: the result of every decoder and data-path operation in pdrouter.
//
// Contract: a default-constructed Status is OK. A failed Status carries a code (stable, used as a
// metrics label through code_label()) and a human-readable message that names the exact field or
// byte position that was wrong. No exceptions cross this boundary.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace pdr {

enum class StatusCode {
  kOk = 0,
  kMalformed,        // bytes are not a valid encoding (bad msgpack, truncated, trailing bytes)
  kTooLarge,         // a size limit was exceeded (whole message, string, array, map)
  kTooDeep,          // nesting depth limit exceeded
  kMissingKey,       // a required key is absent
  kWrongType,        // a key has the wrong type
  kBadAddress,       // an address field does not parse or is invalid
  kOutOfRange,       // a number is outside its allowed range
  kInvalidValue,     // a value is of the right type but not an allowed value (e.g. role "X")
  kUnknownType,      // a message's `type` is not one we know
  kUnauthenticated,  // missing or wrong authentication token
  kRejected,         // well-formed but refused by policy (registry full, conflicting source)
  kNotFound,
  kIoError,
  kInternal,
};

// Stable snake_case label for metrics (e.g. "missing_key").
std::string_view code_label(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "missing_key: dp_size is required" style text for logs and error bodies.
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace pdr
