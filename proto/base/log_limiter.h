// LogLimiter: at most kBurst log lines per second for one kind of message, so a failure that
// repeats per message or per request (a node down under load, a flood of bad frames) cannot fill
// the disk or drown everything else. The lines it holds back are counted and reported in one
// line when the next second's first message passes. Not thread-safe: one per thread (the
// discovery thread has one, each HTTP worker has its own).
#pragma once

#include "proto/base/log.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace pdr {

class LogLimiter {
 public:
  static constexpr int kBurst = 10;

  explicit LogLimiter(std::string_view what) : what_(what) {}

  // True when the caller may log now.
  bool allow(std::chrono::steady_clock::time_point now) {
    if (now - window_start_ >= std::chrono::seconds(1)) {
      if (suppressed_ > 0) pdr::log::warn("{}: {} similar messages suppressed", what_, suppressed_);
      window_start_ = now;
      in_window_ = 0;
      suppressed_ = 0;
    }
    if (in_window_ < kBurst) {
      ++in_window_;
      return true;
    }
    ++suppressed_;
    return false;
  }

 private:
  std::string what_;
  std::chrono::steady_clock::time_point window_start_{};
  int in_window_ = 0;
  uint64_t suppressed_ = 0;
};

}  // namespace pdr
