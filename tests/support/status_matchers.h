// gtest assertion for codec errors: the exact StatusCode and message.
#pragma once

#include <gtest/gtest.h>

#include <string_view>

#include "proto/base/status.h"

namespace pdr::test {

inline ::testing::AssertionResult Fails(const Status& status, StatusCode code, std::string_view message) {
  if (status.code() != code) {
    return ::testing::AssertionFailure() << "expected " << code_label(code) << ", got " << status.to_string();
  }
  if (status.message() != message) {
    return ::testing::AssertionFailure() << "message '" << status.message() << "' != '" << message << "'";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace pdr::test
