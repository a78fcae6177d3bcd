#include "node/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace pdr::node {

void configure_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("pdnode");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

}  // namespace pdr::node
