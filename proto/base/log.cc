#include "proto/base/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace pdr::log {
namespace {

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::kTrace: return spdlog::level::trace;
    case Level::kDebug: return spdlog::level::debug;
    case Level::kInfo: return spdlog::level::info;
    case Level::kWarn: return spdlog::level::warn;
    case Level::kError: return spdlog::level::err;
    case Level::kCritical: return spdlog::level::critical;
    case Level::kOff: break;
  }
  return spdlog::level::off;
}

}  // namespace

std::optional<Level> level_from_name(std::string_view name) {
  static constexpr std::pair<std::string_view, Level> kNames[] = {
      {"trace", Level::kTrace}, {"debug", Level::kDebug}, {"info", Level::kInfo},
      {"warn", Level::kWarn},   {"error", Level::kError}, {"critical", Level::kCritical},
      {"off", Level::kOff}};
  for (const auto& [text, level] : kNames) {
    if (text == name) return level;
  }
  return std::nullopt;
}

void log_to_stderr(const std::string& name, Level level, bool timestamps) {
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_level(to_spdlog(level));
  // Every line reaches stderr at once: tests and operators read it while the process runs.
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
  if (timestamps) spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
}

void set_level(Level level) { spdlog::set_level(to_spdlog(level)); }

bool enabled(Level level) { return spdlog::default_logger_raw()->should_log(to_spdlog(level)); }

void write(Level level, std::string_view line) {
  spdlog::default_logger_raw()->log(to_spdlog(level), line);
}

}  // namespace pdr::log
