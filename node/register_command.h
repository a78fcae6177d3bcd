// `pdnode register`: the registration sidecar (discovery/sidecar/sidecar.h) as a command-line command.
//
// add_register_command() declares the subcommand and its flags on the top-level app and keeps the
// raw flag values in `flags`; after a successful parse, run_register_command() validates them
// (printing a precise error and returning exit code 2 on a bad combination), then runs the sidecar
// until SIGTERM/SIGINT and returns the process exit code. block_stop_signals() must have run first.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace pdr::node {

// --label KEY=VALUE items (repeatable) into sorted, unique labels within the registration limits
// (proto/node_spec.h); "" or the error for the flag. Shared with `pdnode sim --label`.
std::string parse_label_flags(const std::vector<std::string>& items,
                              std::vector<std::pair<std::string, std::string>>* out);

struct RegisterFlags {
  std::vector<std::string> routers;
  std::string role;
  std::string http_address;
  std::string format = "pdrouter";
  std::string connector;
  std::string zmq_address;
  uint32_t dp_size = 0;  // 0: not given
  uint32_t tp_size = 0;
  std::string transfer_mode;
  uint32_t bootstrap_port = 0;
  std::string engine_id;  // NIXL push prefill ("" = not sent)
  uint32_t pp_size = 0;   // 0: not given
  std::string kv_events_endpoint;         // tcp://host:port ("" = not sent)
  std::string kv_events_replay_endpoint;  // tcp://host:port ("" = not sent)
  std::string model;
  std::vector<std::string> labels;
  uint32_t interval_ms = 3000;
  uint32_t ttl_ms = 0;
  std::string health_url;
  uint32_t health_interval_ms = 1000;
  std::string auth_token_env;
  std::string curve_server_key_file;  // the router's public key (certificate or bare Z85)
  std::string curve_key_file;         // this node's secret key (certificate or bare Z85)
  std::string log_level = "info";
};

CLI::App* add_register_command(CLI::App& app, RegisterFlags* flags);
int run_register_command(const RegisterFlags& flags);

}  // namespace pdr::node
