#include "node/logging.h"

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace pdr::node {

void configure_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("pdnode");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

void add_log_level_option(CLI::App* command, std::string* level) {
  command->add_option("--log-level", *level, "Log level: trace, debug, info, warn, error, critical or off.")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->type_name("LEVEL");
}

}  // namespace pdr::node
