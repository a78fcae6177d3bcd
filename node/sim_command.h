// `pdnode sim`: a simulated vLLM OpenAI server (node/sim/server.h) that can register itself with
// routers in its connector's own discovery format, for tests, the quick start and benchmarks on
// machines without GPUs.
//
// add_sim_command() declares the subcommand and keeps raw flag values in `flags`; after a
// successful parse, run_sim_command() validates them (exit code 2 with a precise message on a bad
// combination), starts the server, prints `pdnode sim listening http=HOST:PORT` (plus
// ` bootstrap=HOST:PORT` when a separate Mooncake bootstrap listener runs, and ` kv=HOST:PORT`, the
// first KV side-channel port, on a node moving real KV, and ` kv_events=tcp://HOST:PORT`
// [` kv_events_replay=tcp://HOST:PORT`], rank 0's bound KV events sockets) on stdout, heartbeats
// its registration if --register was given, and runs until SIGTERM/SIGINT (exit 0).
// block_stop_signals() must have run first.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace pdr::node {

struct SimFlags {
  std::string role = "decode";
  std::string connector = "nixl";
  std::string transfer_mode;  // MoRIIO: READ (default) or WRITE
  std::string http = "127.0.0.1:0";
  std::string advertise_host;  // default: the --http host, or 127.0.0.1 for a wildcard
  uint32_t dp_size = 1;
  uint32_t tp_size = 1;
  std::string model = "sim-model";
  uint32_t max_model_len = 0;  // 0: 8192, or the engine profile's with --engine vllm
  uint32_t prefill_us_per_token = 20;
  uint32_t decode_us_per_token = 1000;
  std::vector<std::string> register_endpoints;
  std::vector<std::string> labels;  // --label KEY=VALUE, sent in pdrouter-format registrations
  uint32_t register_interval_ms = 3000;
  uint32_t handshake_port = 6301;
  uint32_t notify_port = 61005;
  int32_t kv_port = -1;  // -1: connector default (NIXL 5600, P2P-NCCL 21001, Mooncake 17000)
  uint32_t render_feature_bytes = 4096;  // fake feature bytes per image in a render answer
  int32_t bootstrap_port = -1;  // Mooncake prefill: separate /query listener; -1 none, 0 ephemeral
  uint32_t workers = 1;
  // HTTPS as vLLM's --ssl-* flags give it: certificate chain and key, and with --ssl-cert-reqs 2
  // client certificates required and verified against --ssl-ca-certs (mutual TLS).
  std::string ssl_certfile;
  std::string ssl_keyfile;
  std::string ssl_ca_certs;
  uint32_t ssl_cert_reqs = 0;  // 0 none, 2 required (vLLM's ssl.CERT_* numbers)
  // Real KV transfer (node/sim/kv_mover.h); "none" keeps the NullKvMover.
  std::string kv_backends = "tcp";
  uint32_t kv_blocks = 2048;
  uint32_t kv_block_bytes = 16384;
  uint32_t kv_layers = 2;
  uint32_t kv_hold_ms = 60000;
  uint32_t kv_timeout_ms = 30000;
  // Prefix cache and vLLM KV cache events (node/sim/cache_model.h).
  uint32_t kv_block_tokens = 0;  // --block-size too; 0: 16, or the engine profile's
  uint32_t prefix_cache_blocks = 0;  // 0: kv_blocks
  std::string kv_events_endpoint;         // tcp://HOST:PORT to bind; "" publishes nothing
  std::string kv_events_replay_endpoint;  // tcp://HOST:PORT to bind; "" no replay socket
  std::string kv_events_encoding = "map";
  std::string kv_events_replay_layout = "topic";  // topic (vLLM >= 0.26) or no-topic
  std::string kv_events_groups;  // KIND[:WINDOW],... (node/sim/kv_events_encode.h)
  std::string kv_events_cpu_tier = "none";         // none, self-describing or placeholder
  bool bidirectional_kv_xfer = false;
  bool tokens_only = false;
  // The simulated vLLM engine (node/sim/engine/): "per-token" (each request paced on its own by
  // --prefill-us-per-token / --decode-us-per-token) or "vllm".
  std::string engine = "per-token";
  std::string engine_profile;  // a profile file (node/sim/engine/profile.h)
  // Engine settings given as flags (--max-num-seqs ...), as (name, value text), in order.
  std::vector<std::pair<std::string, std::string>> engine_settings;
  double time_scale = 1.0;
  std::string log_level = "info";
};

CLI::App* add_sim_command(CLI::App& app, SimFlags* flags);
int run_sim_command(const SimFlags& flags);

}  // namespace pdr::node
