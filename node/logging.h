// pdnode's logging: one stderr logger for every subcommand, so stdout stays free for the
// machine-readable lines tests and scripts parse ("pdnode sim listening http=...").
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace pdr::node {

// `level` is one of the names of pdr::log::level_from_name (trace, debug, info, warn, error, critical, off).
void configure_logging(const std::string& level);

// Adds the shared `--log-level LEVEL` option (validated against those names) to a subcommand.
void add_log_level_option(CLI::App* command, std::string* level);

}  // namespace pdr::node
