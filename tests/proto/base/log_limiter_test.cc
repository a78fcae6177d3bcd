// LogLimiter: a burst per second, then silence, then one line saying how much was held back.
#include "proto/base/log_limiter.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>

namespace pdr {
namespace {

using namespace std::chrono_literals;

// Captures what spdlog's default logger prints while the test runs.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(out_);
    sink->set_pattern("%v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::string text() const { return out_.str(); }

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::ostringstream out_;
};

TEST(LogLimiter, BurstThenSilenceThenASummary) {
  CapturedLog log;
  LogLimiter limiter("proxy");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < LogLimiter::kBurst; ++i) EXPECT_TRUE(limiter.allow(t0 + 1ms * i)) << i;
  for (int i = 0; i < 25; ++i) EXPECT_FALSE(limiter.allow(t0 + 500ms));
  EXPECT_EQ(log.text(), "");
  EXPECT_TRUE(limiter.allow(t0 + 1s));  // a new second
  EXPECT_EQ(log.text(), "proxy: 25 similar messages suppressed\n");
  EXPECT_TRUE(limiter.allow(t0 + 2500ms));  // nothing held back: no summary
  EXPECT_EQ(log.text(), "proxy: 25 similar messages suppressed\n");
}

}  // namespace
}  // namespace pdr
