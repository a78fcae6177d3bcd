#include "node/logging.h"

#include <CLI/CLI.hpp>
#include "proto/base/log.h"

namespace pdr::node {

void configure_logging(const std::string& level) {
  pdr::log::log_to_stderr("pdnode", pdr::log::level_from_name(level).value_or(pdr::log::Level::kInfo),
                          /*timestamps=*/false);
}

void add_log_level_option(CLI::App* command, std::string* level) {
  command->add_option("--log-level", *level, "Log level: trace, debug, info, warn, error, critical or off.")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->type_name("LEVEL");
}

}  // namespace pdr::node
