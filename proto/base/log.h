// pdr::log: the one way product code writes a log line. A thin front over spdlog: the format
// string is checked at compile time by fmt, a line is formatted only when its level is on, and
// spdlog itself (whose headers cost several seconds of compile time per translation unit) is
// included by proto/base/log.cc alone. Thread-safe: every call may come from any thread.
#pragma once

#include <fmt/core.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace pdr::log {

enum class Level : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kCritical, kOff };

// The names accepted by --log-level: trace, debug, info, warn, error, critical, off.
std::optional<Level> level_from_name(std::string_view name);

// Sends every line to stderr through a logger called `name` at `level`. With `timestamps`, each
// line starts with an ISO-8601 time and the level (the router's format); without, spdlog's default.
void log_to_stderr(const std::string& name, Level level, bool timestamps);
void set_level(Level level);

bool enabled(Level level);
void write(Level level, std::string_view line);

template <typename... Args>
void at(Level level, fmt::format_string<Args...> format, Args&&... args) {
  if (!enabled(level)) return;
  write(level, fmt::vformat(format, fmt::make_format_args(args...)));
}

template <typename... Args>
void trace(fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kTrace, format, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kDebug, format, std::forward<Args>(args)...);
}
template <typename... Args>
void info(fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kInfo, format, std::forward<Args>(args)...);
}
template <typename... Args>
void warn(fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kWarn, format, std::forward<Args>(args)...);
}
template <typename... Args>
void error(fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kError, format, std::forward<Args>(args)...);
}
template <typename... Args>
void critical(fmt::format_string<Args...> format, Args&&... args) {
  at(Level::kCritical, format, std::forward<Args>(args)...);
}

}  // namespace pdr::log
