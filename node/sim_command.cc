#include "node/sim_command.h"

#include "discovery/config/topology_secrets.h"
#include "router/http/tls_server.h"

#include "node/register_command.h"
#include "node/logging.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <tuple>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>

#include <CLI/CLI.hpp>
#include "proto/base/log.h"

#include "discovery/sidecar/node_client.h"
#include "node/sim/dialect.h"
#include "node/sim/engine/profile.h"
#include "node/sim/kv_events_encode.h"
#include "node/sim/kv_mover.h"
#include "node/sim/server.h"
#include "node/stop_signals.h"
#include "proto/address.h"

namespace pdr::node {
namespace {

constexpr int kExitBadFlags = 2;
constexpr int kExitRuntime = 1;

using FlagError = std::string;
using proto::Connector;

// The --connector names of the dialects that satisfy `wanted`, once each, in table order.
template <typename Pred>
std::vector<std::string> connector_names(Pred wanted) {
  std::vector<std::string> names;
  for (const sim::SimDialect* d : sim::sim_dialects()) {
    const std::string name(proto::to_string(d->connector));
    if (wanted(*d) && std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(name);
    }
  }
  return names;
}

// "a, b or c".
std::string one_of(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " or " : ", ";
    text += names[i];
  }
  return text;
}

// HOST:PORT like proto::parse_host_port, but port 0 (ephemeral) is allowed.
FlagError parse_listen_address(const std::string& text, proto::HostPort* out) {
  const size_t colon = text.rfind(':');
  if (colon == std::string::npos) return "--http '" + text + "': expected HOST:PORT";
  const std::string port = text.substr(colon + 1);
  unsigned long value = 0;
  try {
    size_t used = 0;
    value = std::stoul(port, &used);
    if (used != port.size() || value > 65535) throw std::out_of_range(port);
  } catch (const std::exception&) {
    return "--http '" + text + "': port '" + port + "' is not in 0..65535";
  }
  if (Status s = proto::parse_host(text.substr(0, colon), &out->host); !s.is_ok()) {
    return "--http '" + text + "': " + s.message();
  }
  out->port = static_cast<uint16_t>(value);
  return "";
}

// A KV events socket to bind: tcp://HOST:PORT, HOST an address or * (every interface), port 0
// ephemeral.
FlagError parse_bind_endpoint(const char* flag, const std::string& text, std::string* host,
                              uint16_t* port) {
  const std::string scheme = "tcp://";
  if (!text.starts_with(scheme)) return std::string(flag) + " '" + text + "': expected tcp://HOST:PORT";
  const std::string rest = text.substr(scheme.size());
  if (rest.starts_with("*:")) {
    proto::HostPort any;
    if (FlagError e = parse_listen_address("0.0.0.0" + rest.substr(1), &any); !e.empty()) {
      return std::string(flag) + " '" + text + "': bad port";
    }
    *host = "*";
    *port = any.port;
    return "";
  }
  proto::HostPort address;
  if (FlagError e = parse_listen_address(rest, &address); !e.empty()) {
    return std::string(flag) + " '" + text + "': expected tcp://HOST:PORT";
  }
  *host = address.host;
  *port = address.port;
  return "";
}

constexpr uint32_t kMaxListedRanks = 64;

// The publisher the flags ask for, or none.
FlagError build_kv_events(const SimFlags& f, const sim::SimOptions& options,
                          std::optional<sim::SimKvEventsPublisherOptions>* out) {
  if (f.kv_events_replay_layout != "topic" && f.kv_events_replay_layout != "no-topic") {
    return "--kv-events-replay-layout '" + f.kv_events_replay_layout + "': expected topic or no-topic";
  }
  if (f.kv_events_endpoint.empty()) {
    if (!f.kv_events_replay_endpoint.empty()) {
      return "--kv-events-replay-endpoint needs --kv-events-endpoint";
    }
    return "";
  }
  sim::SimKvEventsPublisherOptions p;
  if (FlagError e = parse_bind_endpoint("--kv-events-endpoint", f.kv_events_endpoint, &p.host,
                                        &p.port);
      !e.empty()) {
    return e;
  }
  if (!f.kv_events_replay_endpoint.empty()) {
    std::string host;
    uint16_t port = 0;
    if (FlagError e = parse_bind_endpoint("--kv-events-replay-endpoint",
                                          f.kv_events_replay_endpoint, &host, &port);
        !e.empty()) {
      return e;
    }
    if (host != p.host) {
      return "--kv-events-replay-endpoint must bind the same host as --kv-events-endpoint";
    }
    p.replay_port = port;
  }
  p.replay_with_topic = f.kv_events_replay_layout == "topic";
  p.ranks = options.node.dp_size;
  // Port 0 gives each rank an ephemeral port of its own, listed in the registration, whose
  // decoder takes at most 64 list items (proto::DecodeLimits).
  if ((p.port == 0 || p.replay_port == uint16_t{0}) && p.ranks > kMaxListedRanks) {
    return "--kv-events-endpoint / --kv-events-replay-endpoint port 0 gives each DP rank an "
           "ephemeral port, listed in the registration for at most " +
           std::to_string(kMaxListedRanks) + " ranks: give a fixed port for --dp-size " +
           std::to_string(p.ranks);
  }
  *out = p;
  return "";
}

constexpr uint32_t kDefaultMaxModelLen = 8192;
constexpr uint32_t kDefaultBlockTokens = 16;

// --ssl-*: vLLM's HTTPS flags (its uvicorn server), on the sim's HTTP listener.
FlagError build_tls(const SimFlags& f, sim::SimOptions* out) {
  if (f.ssl_certfile.empty() && f.ssl_keyfile.empty()) {
    if (!f.ssl_ca_certs.empty() || f.ssl_cert_reqs != 0) return "--ssl-ca-certs and --ssl-cert-reqs need --ssl-certfile";
    return "";
  }
  if (f.ssl_certfile.empty() || f.ssl_keyfile.empty()) return "--ssl-certfile and --ssl-keyfile go together";
  if (f.ssl_cert_reqs != 0 && f.ssl_cert_reqs != 2) return "--ssl-cert-reqs: 0 (none) or 2 (required)";
  if (f.ssl_cert_reqs == 2 && f.ssl_ca_certs.empty()) return "--ssl-cert-reqs 2 needs --ssl-ca-certs";
  http::TlsServerOptions options;
  for (const auto& [flag, path, pem] : {std::tuple{"--ssl-certfile", &f.ssl_certfile, &options.cert_pem},
                                        std::tuple{"--ssl-keyfile", &f.ssl_keyfile, &options.key_pem},
                                        std::tuple{"--ssl-ca-certs", &f.ssl_ca_certs, &options.client_ca_pem}}) {
    if (path->empty() || (pem == &options.client_ca_pem && f.ssl_cert_reqs != 2)) continue;
    if (Status s = config::read_small_file(*path, 1 << 20, pem); !s) {
      return std::string(flag) + " '" + *path + "': " + s.message();
    }
  }
  if (Status s = http::TlsServerContext::create(options, &out->tls); !s) return s.message();
  return "";
}

// --engine vllm: the profile file, then the flags (they win), then the cross-setting checks.
FlagError build_engine(const SimFlags& f, sim::SimOptions* out) {
  if (f.engine == "per-token") {
    if (!f.engine_profile.empty()) return "--engine-profile needs --engine vllm";
    if (!f.engine_settings.empty()) return "--" + f.engine_settings.front().first + " needs --engine vllm";
    return "";
  }
  if (f.engine != "vllm") return "--engine '" + f.engine + "': expected per-token or vllm";
  if (f.prefix_cache_blocks != 0) {
    return "--prefix-cache-blocks does not apply with --engine vllm: its prefix cache is its KV cache "
           "(--num-gpu-blocks-override)";
  }
  sim::EngineProfile profile;
  if (!f.engine_profile.empty()) {
    std::ifstream file(f.engine_profile);
    std::stringstream text;
    text << file.rdbuf();
    if (!file) return "--engine-profile '" + f.engine_profile + "': cannot read it";
    if (std::string e = sim::apply_engine_profile_text(&profile, text.str()); !e.empty()) {
      return "--engine-profile '" + f.engine_profile + "': " + e;
    }
  }
  std::vector<std::pair<std::string, std::string>> settings = f.engine_settings;
  if (f.max_model_len != 0) settings.emplace_back("max-model-len", std::to_string(f.max_model_len));
  if (f.kv_block_tokens != 0) settings.emplace_back("block-size", std::to_string(f.kv_block_tokens));
  for (const auto& [name, value] : settings) {
    if (std::string e = sim::set_engine_setting(&profile, name, value); !e.empty()) return "--" + e;
  }
  if (std::string e = sim::validate_engine_profile(profile); !e.empty()) return e;
  sim::SimEngineOptions engine;
  engine.profile = profile;
  out->engine = engine;
  return "";
}

FlagError build_options(const SimFlags& f, sim::SimOptions* out) {
  sim::KvNodeIdentity& node = out->node;
  if (!proto::parse_role(f.role, &node.role)) {
    return "--role '" + f.role + "': expected prefill or decode";
  }
  if (!proto::parse_connector(f.connector, &node.connector) ||
      node.connector == Connector::kUnknown) {
    return "--connector '" + f.connector + "': expected " +
           one_of(connector_names([](const sim::SimDialect&) { return true; }));
  }
  // A connector with transfer modes has one dialect per mode; the first is the default.
  const proto::TransferMode default_mode = sim::default_transfer_mode(node.connector);
  if (default_mode != proto::TransferMode::kNone) {
    const std::string mode =
        f.transfer_mode.empty() ? std::string(proto::to_string(default_mode)) : f.transfer_mode;
    if (!proto::parse_transfer_mode(mode, &node.transfer_mode) ||
        sim::find_sim_dialect(node.connector, node.transfer_mode) == nullptr) {
      return "--transfer-mode '" + mode + "': expected READ or WRITE";
    }
  } else if (!f.transfer_mode.empty()) {
    return "--transfer-mode only applies to --connector " +
           one_of(connector_names([](const sim::SimDialect& d) {
             return d.transfer_mode != proto::TransferMode::kNone;
           }));
  }
  const sim::SimDialect* dialect = sim::find_sim_dialect(node);
  if (dialect == nullptr) {
    return "--connector '" + f.connector + "': not simulated";
  }
  proto::HostPort http;
  if (FlagError e = parse_listen_address(f.http, &http); !e.empty()) return e;
  out->host = http.host;
  out->port = http.port;
  const bool wildcard = http.host == "0.0.0.0" || http.host == "::";
  node.advertise_host = !f.advertise_host.empty() ? f.advertise_host
                        : wildcard                 ? "127.0.0.1"
                                                   : http.host;
  node.dp_size = f.dp_size;
  node.tp_size = f.tp_size;
  node.handshake_port = static_cast<uint16_t>(f.handshake_port);
  node.notify_port = static_cast<uint16_t>(f.notify_port);
  node.kv_port = f.kv_port >= 0 ? static_cast<uint16_t>(f.kv_port) : dialect->default_kv_port;
  if (f.kv_backends == "none" && (node.kv_port == 0 || node.handshake_port == 0 ||
                                  node.notify_port == 0)) {
    return "port 0 (ephemeral) for --kv-port/--handshake-port/--notify-port needs a KV side "
           "channel: not with --kv-backends none";
  }
  const uint64_t pool_bytes = uint64_t{f.kv_blocks} * f.kv_block_bytes * f.kv_layers;
  if (pool_bytes > (uint64_t{16} << 30)) {
    return "--kv-blocks x --kv-block-bytes x --kv-layers is " + std::to_string(pool_bytes) +
           " bytes; at most 16 GiB";
  }
  out->workers = f.workers;
  out->model = f.model;
  if (!(f.time_scale > 0 && f.time_scale <= 1000)) {
    return "--time-scale " + std::to_string(f.time_scale) + ": expected a number in (0, 1000]";
  }
  out->time_scale = f.time_scale;
  if (FlagError e = build_tls(f, out); !e.empty()) return e;
  if (FlagError e = build_engine(f, out); !e.empty()) return e;
  out->max_model_len = out->engine ? out->engine->profile.max_model_len
                       : f.max_model_len != 0 ? f.max_model_len
                                              : kDefaultMaxModelLen;
  out->prefill_us_per_token = f.prefill_us_per_token;
  out->bidirectional_kv_xfer = f.bidirectional_kv_xfer;
  out->tokens_only = f.tokens_only;
  out->decode_us_per_token = f.decode_us_per_token;
  out->render_feature_bytes = f.render_feature_bytes;
  proto::Labels labels;
  if (FlagError e = parse_label_flags(f.labels, &labels); !e.empty()) return e;
  if (f.bootstrap_port >= 0) {
    if (dialect->bootstrap_query == nullptr || node.role != proto::Role::kPrefill) {
      return "--bootstrap-port only applies to --connector " +
             one_of(connector_names(
                 [](const sim::SimDialect& d) { return d.bootstrap_query != nullptr; })) +
             " --role prefill";
    }
    out->bootstrap_port = static_cast<uint16_t>(f.bootstrap_port);
  }
  return "";
}

// The registration each connector's real node sends (docs/design/wire-formats.md 1.1, 2), or the
// pdrouter format for connectors that have no discovery of their own: the dialect's part
// (SimDialect::fill_registration) on the common one.
proto::Registration build_registration(const SimFlags& f, const sim::SimServer& server,
                                       const sim::SimOptions& options,
                                       const std::optional<proto::HostPort>& kv_events,
                                       const std::optional<proto::HostPort>& kv_events_replay,
                                       const std::vector<uint16_t>& kv_events_ports,
                                       const std::vector<uint16_t>& kv_events_replay_ports) {
  const sim::KvNodeIdentity& node = options.node;
  proto::Registration reg;
  reg.role = node.role;
  reg.http_address = proto::HostPort{node.advertise_host, server.port()};
  reg.connector = node.connector;
  sim::SimRegistrationInputs in;
  in.node = &node;
  in.bootstrap_port = server.bootstrap_port();
  in.model = f.model;
  in.moves_kv = f.kv_backends != "none";
  sim::find_sim_dialect(node)->fill_registration(in, &reg);
  parse_label_flags(f.labels, &reg.labels);  // validated by build_options
  // Only the pdrouter format carries KV events endpoints.
  if (reg.format == proto::RegistrationFormat::kPdrouter) {
    reg.kv_events_endpoint = kv_events;
    reg.kv_events_replay_endpoint = kv_events_replay;
    reg.kv_events_ports = kv_events_ports;
    reg.kv_events_replay_ports = kv_events_replay_ports;
  }
  return reg;
}

}  // namespace

namespace {

// --engine, --engine-profile, --time-scale and one flag per engine setting
// (node/sim/engine/profile.h), under vLLM's flag names where vLLM has one.
void add_engine_options(CLI::App* cmd, SimFlags* f) {
  const char* group = "Engine (--engine vllm; see below)";
  cmd->add_option("--engine", f->engine,
                  "How generation is timed: per-token (each request on its own, "
                  "--prefill-us-per-token / --decode-us-per-token) or vllm (a simulated vLLM V1 "
                  "engine per DP rank: steps, token budget, seats, KV blocks, preemption, prefix "
                  "cache).")
      ->capture_default_str()->type_name("per-token|vllm")->group(group);
  cmd->add_option("--engine-profile", f->engine_profile,
                  "File of engine settings, one per line: 'name: value' (flat YAML) or "
                  "'name=value', names as the flags below without '--'; flags win over it.")
      ->type_name("FILE")->group(group);
  cmd->add_option("--time-scale", f->time_scale,
                  "Wall-clock seconds per modelled second, for every modelled duration (engine "
                  "steps, KV transfers, per-token times); 0.1 replays an hour in 6 minutes.")
      ->capture_default_str()->type_name("X")->group(group);
  for (const sim::EngineSettingInfo& info : sim::engine_setting_infos()) {
    if (info.name == "block-size" || info.name == "max-model-len") continue;  // flags of their own
    const std::string name = info.name;
    cmd->add_option_function<std::string>(
           "--" + name, [f, name](const std::string& value) { f->engine_settings.emplace_back(name, value); },
           info.help + " Default " + info.default_value + ".")
        ->type_name("X")->group(group);
  }
}

}  // namespace

CLI::App* add_sim_command(CLI::App& app, SimFlags* f) {
  CLI::App* cmd = app.add_subcommand(
      "sim",
      "Run a simulated vLLM OpenAI server (no GPU): /health, /v1/models, /v1/completions,\n"
      "/v1/chat/completions, /v1/responses, Anthropic's /v1/messages (and its count_tokens) and\n"
      "/inference/v1/generate (token ids in and out) in vLLM's formats (and fakes of /tokenize,\n"
      "/detokenize, /v1/embeddings, the two /render endpoints and a small /metrics),\n"
      "kv_transfer_params checked per connector, prefill\n"
      "and decode time modelled per token, deterministic text. Test endpoints: GET /sim/requests,\n"
      "POST /sim/reset, /sim/faults (below), GET /sim/kv (KV transfer counters), GET\n"
      "/sim/prefix_cache (prefix caches, KV events counters); POST /reset_prefix_cache as vLLM. With\n"
      "--kv-backends (default tcp) every P/D request moves real, verified KV bytes from the\n"
      "prefill sim to the decode sim. Runs until SIGTERM/SIGINT. Exit codes: 0 clean stop,\n"
      "1 runtime failure, 2 bad flags.");
  cmd->add_option("--role", f->role, "prefill or decode.")->capture_default_str()
      ->type_name("prefill|decode");
  cmd->add_option("--connector", f->connector,
                  "KV connector dialect: nixl, moriio, mooncake, p2p-nccl, sglang or nixl-push.")
      ->capture_default_str()->type_name("NAME");
  cmd->add_option("--transfer-mode", f->transfer_mode, "MoRIIO transfer mode (default READ).")
      ->type_name("READ|WRITE");
  cmd->add_option("--http", f->http, "Listen address HOST:PORT (port 0: ephemeral).")
      ->capture_default_str()->type_name("HOST:PORT");
  cmd->add_option("--advertise-host", f->advertise_host,
                  "Host put in registrations and kv_transfer_params (default: the --http host, or "
                  "127.0.0.1 when it is a wildcard).")
      ->type_name("HOST");
  cmd->add_option("--dp-size", f->dp_size, "Data-parallel size.")->capture_default_str()
      ->check(CLI::Range(1, 1024))->type_name("N");
  cmd->add_option("--tp-size", f->tp_size, "Tensor-parallel size.")->capture_default_str()
      ->check(CLI::Range(1, 1024))->type_name("N");
  cmd->add_option("--model", f->model, "Served model name.")->capture_default_str()
      ->type_name("NAME");
  cmd->add_option("--max-model-len", f->max_model_len,
                  "max_model_len reported and enforced (default 8192; with --engine vllm the "
                  "profile's, 131072).")
      ->check(CLI::Range(2, 10000000))->type_name("N");
  cmd->add_option("--prefill-us-per-token", f->prefill_us_per_token,
                  "Simulated prefill time per prompt token, in microseconds.")
      ->capture_default_str()->type_name("US");
  cmd->add_option("--decode-us-per-token", f->decode_us_per_token,
                  "Simulated decode time per output token, in microseconds.")
      ->capture_default_str()->type_name("US");
  cmd->add_option("--render-feature-bytes", f->render_feature_bytes,
                  "Fake feature bytes per image in a /v1/chat/completions/render answer (sent "
                  "base64, so the answer grows by 4/3 of this per image).")
      ->capture_default_str()->check(CLI::Range(0, 64 << 20))->type_name("BYTES");
  cmd->add_option("--register", f->register_endpoints,
                  "Router discovery endpoint (tcp://HOST:PORT) to heartbeat to, in the connector's "
                  "own format (moriio, p2p-nccl) or the pdrouter format. Repeatable.")
      ->type_name("ENDPOINT");
  cmd->add_option("--label", f->labels,
                  "KEY=VALUE label sent with the registration (pdrouter format: nixl, mooncake, "
                  "sglang), e.g. serves=render,pooling. Repeatable.")
      ->type_name("KEY=VALUE");
  cmd->add_option("--register-interval-ms", f->register_interval_ms, "Heartbeat period.")
      ->capture_default_str()->check(CLI::Range(10, 3600000))->type_name("MS");
  cmd->add_option("--handshake-port", f->handshake_port,
                  "MoRIIO handshake port (advertised; with real KV, the node's KV side channel is "
                  "bound here; 0: ephemeral, needs --kv-backends other than none).")
      ->capture_default_str()->check(CLI::Range(0, 65535))->type_name("PORT");
  cmd->add_option("--notify-port", f->notify_port,
                  "MoRIIO notify port (advertised; bound too with real KV; 0: ephemeral).")
      ->capture_default_str()->check(CLI::Range(0, 65535))->type_name("PORT");
  cmd->add_option("--kv-port", f->kv_port,
                  "KV side-channel base port (advertised): NIXL remote_port (+ DP rank), P2P-NCCL "
                  "zmq_address, Mooncake worker_addr (+ dp * tp_size + tp), SGLang bootstrap_port. "
                  "A node moving real KV binds every one of them (0: an ephemeral base). "
                  "Default per connector: 5600, 21001, 17000 (others 5600).")
      ->check(CLI::Range(0, 65535))->type_name("PORT");
  cmd->add_option("--bootstrap-port", f->bootstrap_port,
                  "Mooncake prefill: also serve the bootstrap GET /query on this port (0: "
                  "ephemeral). It is always served on the --http port too.")
      ->check(CLI::Range(0, 65535))->type_name("PORT");
  cmd->add_option("--ssl-certfile", f->ssl_certfile, "Serve HTTPS with this certificate chain (PEM), as vLLM.")
      ->type_name("FILE");
  cmd->add_option("--ssl-keyfile", f->ssl_keyfile, "The key of --ssl-certfile (PEM).")->type_name("FILE");
  cmd->add_option("--ssl-ca-certs", f->ssl_ca_certs, "CA certificates that client certificates must verify against.")
      ->type_name("FILE");
  cmd->add_option("--ssl-cert-reqs", f->ssl_cert_reqs, "0: no client certificate; 2: one is required (mutual TLS).")
      ->capture_default_str()->type_name("0|2");
  cmd->add_option("--workers", f->workers, "HTTP worker threads.")->capture_default_str()
      ->check(CLI::Range(1, 256))->type_name("N");
  cmd->add_option("--kv-backends", f->kv_backends,
                  "Move real KV bytes between prefill and decode sims with the transfer engine over "
                  "these backends, in preference order (\"tcp\", \"shm,tcp\", ...); \"none\": "
                  "move nothing and accept every decode (no side channel is bound).")
      ->capture_default_str()->type_name("LIST|none");
  cmd->add_option("--kv-blocks", f->kv_blocks, "KV pool size in blocks (16 tokens per block).")
      ->capture_default_str()->check(CLI::Range(1, 1 << 20))->type_name("N");
  cmd->add_option("--kv-block-bytes", f->kv_block_bytes,
                  "Bytes of one block of one layer (prefill and decode must agree).")
      ->capture_default_str()->check(CLI::Range(64, 64 << 20))->type_name("BYTES");
  cmd->add_option("--kv-layers", f->kv_layers, "Layers per block (prefill and decode must agree).")
      ->capture_default_str()->check(CLI::Range(1, 1024))->type_name("N");
  cmd->add_option("--kv-hold-ms", f->kv_hold_ms,
                  "How long a prefill holds KV blocks no decode pulled (then they are reaped and "
                  "counted, like MoRIIO's reaper); also how long a decode keeps blocks a late "
                  "WRITE may still land in.")
      ->capture_default_str()->check(CLI::Range(1, 86400000))->type_name("MS");
  cmd->add_option("--kv-timeout-ms", f->kv_timeout_ms,
                  "How long a decode waits for its KV (side channel, READ, or the prefill's "
                  "WRITE) before failing the request (504 kv_timeout).")
      ->capture_default_str()->check(CLI::Range(1, 86400000))->type_name("MS");
  cmd->add_option("--kv-block-tokens,--block-size", f->kv_block_tokens,
                  "Tokens per block of the prefix cache and KV events, vLLM's --block-size "
                  "(default 16; with --engine vllm the profile's, 16).")
      ->check(CLI::Range(1, 4096))->type_name("N");
  cmd->add_option("--prefix-cache-blocks", f->prefix_cache_blocks,
                  "Blocks each DP rank's prefix cache holds (LRU beyond), default --kv-blocks. A "
                  "prompt's full blocks already cached cost no prefill time; a text prompt's "
                  "token ids are one per word. See GET /sim/prefix_cache.")
      ->check(CLI::Range(1, 1 << 24))->type_name("N");
  cmd->add_option("--kv-events-endpoint", f->kv_events_endpoint,
                  "Publish vLLM KV cache events (BlockStored, BlockRemoved, AllBlocksCleared) on a "
                  "ZMQ PUB socket bound here, tcp://HOST:PORT (HOST may be *); DP rank r binds PORT+r "
                  "as vLLM's do, or with port 0 an ephemeral port of its own (at most 64 ranks; "
                  "each rank's port is listed in the registration and GET /sim/prefix_cache). "
                  "Advertised in pdrouter-format registrations.")
      ->type_name("tcp://HOST:PORT");
  cmd->add_option("--kv-events-replay-endpoint", f->kv_events_replay_endpoint,
                  "Also bind vLLM's replay ROUTER socket here (last 10000 batches, 64 MiB, per rank; same "
                  "HOST; rank r at PORT+r; port 0: each rank ephemeral).")
      ->type_name("tcp://HOST:PORT");
  cmd->add_option("--kv-events-encoding", f->kv_events_encoding,
                  "Event encoding: map (vLLM >= 0.26, tagged by \"type\") or array (older vLLM).")
      ->capture_default_str()->type_name("map|array");
  cmd->add_option("--kv-events-groups", f->kv_events_groups,
                  "Publish the prefix cache as a hybrid model's KV cache groups, e.g. "
                  "full_attention,sliding_window:512 (KIND is vLLM's kv_cache_spec_kind, WINDOW a "
                  "sliding window in tokens): each change once per group with group_idx and the "
                  "group's kind; a group with a WINDOW removes the blocks it slid past (all but "
                  "the last WINDOW tokens' blocks of each stored run) at once. Default: no groups "
                  "(events name none).")
      ->type_name("KIND[:WINDOW],...");
  cmd->add_option("--kv-events-cpu-tier", f->kv_events_cpu_tier,
                  "Also publish a CPU offload tier that keeps every stored block until a reset: a "
                  "second BlockStored with medium CPU for each stored run (in each full-attention "
                  "group), self-describing (tokens and parent, as vLLM's offloading connector with "
                  "self_describing_kv_events) or placeholder (engine keys only, block_size 0). GPU "
                  "evictions leave the CPU copies.")
      ->capture_default_str()->type_name("none|self-describing|placeholder");
  cmd->add_option("--kv-events-replay-layout", f->kv_events_replay_layout,
                  "Frames of the replay socket's answers: topic = [topic, seq, payload] like live "
                  "messages, end marker [\"\", END, \"\"] (vLLM >= 0.26); no-topic = [seq, "
                  "payload], end marker [END, \"\"] (older vLLM, SGLang). END is seq -1.")
      ->capture_default_str()->type_name("topic|no-topic");
  cmd->add_flag("--bidirectional-kv-xfer", f->bidirectional_kv_xfer,
                "NIXL (vLLM's kv_connector_extra_config.bidirectional_kv_xfer, on both roles): a "
                "decode ends each answer with kv_transfer_params for the conversation's next turn "
                "(the JSON answer's field, or a last stream chunk before [DONE]) naming blocks of "
                "its KV pool that it keeps; a prefill given such params (do_remote_decode with "
                "remote_block_ids) pulls those blocks over the KV side channel before computing, "
                "and computes only the tokens neither they nor its prefix cache hold "
                "(/sim/requests: kv_reused_tokens).");
  cmd->add_flag("--tokens-only", f->tokens_only,
                "As vLLM's --tokens-only: serve POST /abort_requests {\"request_ids\": [...]}, each id "
                "ending the in-flight /inference/v1/generate request it names (\"generate-tokens-\" + "
                "its X-Request-Id). Label the node serves=tokens-only (--label) so pdrouter uses it.");
  add_engine_options(cmd, f);
  add_log_level_option(cmd, &f->log_level);
  cmd->footer(
      "Engine (--engine vllm): each DP rank runs vLLM V1's scheduler. A step gives running\n"
      "requests (admission order) then waiting ones (FCFS) min(tokens they lack, budget left)\n"
      "tokens, at most --max-num-batched-tokens in all and --max-num-seqs running; a prompt is\n"
      "looked up in the prefix cache (full blocks, at most all but its last token) and takes\n"
      "blocks of --block-size tokens from the --num-gpu-blocks-override pool, whose free queue\n"
      "evicts the least recently freed block first; the first request that cannot get blocks\n"
      "stops admission; a running one that cannot grow preempts the newest running request\n"
      "(recomputed later, from the head of the queue). A P/D decode takes blocks for its prompt\n"
      "without a seat, pulls the KV (real bytes through the transfer engine, plus the modelled\n"
      "time below), then computes one token: the client's first. Tokens leave at step ends.\n"
      "  step ms = step-overhead-ms + max(step-weight-read-ms, step-ms-per-token x N)\n"
      "          + step-ms-per-attention-pair x sum over prefill chunks of q x (p + q/2)\n"
      "          + step-ms-per-context-token x sum over decodes of their context\n"
      "  (N tokens in the step; a chunk computes q tokens after p; a decode computes 1);\n"
      "  KV pull ms = kv-transfer-latency-ms + bytes / kv-transfer-gbps, the pulls running at\n"
      "  once sharing kv-node-gbps; bytes = kv-bytes-per-token x tokens pulled.\n"
      "Defaults: Llama-3.1-8B on one H100 (8192 tokens, 1024 seqs, 29000 blocks of 16,\n"
      "max_model_len 131072; 7.5 ms for a lone decode, ~183 ms for an 8k prompt).\n"
      "Every duration is multiplied by --time-scale. GET /metrics then shows vLLM's own\n"
      "families (num_requests_running/waiting, kv_cache_usage_perc, prefix cache, preemption\n"
      "and token counters, TTFT/ITL/e2e/queue histograms in wall-clock seconds).\n"
      "\n"
      "Fault injection (tests only): POST /sim/faults with a JSON object queues a fault for the\n"
      "next matching request(s); DELETE /sim/faults clears them; GET /sim/faults lists them.\n"
      "  {\"status\": 500}               answer with this status and vLLM's error body\n"
      "  {\"hang\": true}                never answer (the client's close counts as an abort)\n"
      "  {\"close_after_tokens\": 3}     stream: 3 token events, then cut the connection;\n"
      "                                non-stream: close unanswered when the answer is due\n"
      "  {\"close_immediately\": true}   close the connection as soon as the request arrives\n"
      "  {\"delay_ms\": 500}             wait before the first byte (combines with the above)\n"
      "  \"count\": N (default 1, -1 until cleared), \"path\": \"/v1/completions\" (default: both\n"
      "  generation endpoints). GET /sim/requests shows each entry's \"fault\" and\n"
      "  counters.faults_applied.");
  return cmd;
}

int run_sim_command(const SimFlags& flags) {
  sim::SimOptions options;
  if (FlagError e = build_options(flags, &options); !e.empty()) {
    std::fprintf(stderr, "pdnode sim: error: %s\nRun 'pdnode sim --help' for usage.\n", e.c_str());
    return kExitBadFlags;
  }
  configure_logging(flags.log_level);
  std::unique_ptr<sim::KvMover> mover;
  std::optional<uint16_t> kv_listen_port;
  if (flags.kv_backends != "none") {
    sim::EngineKvMoverOptions kv;
    kv.node = options.node;
    kv.bind_host = options.host;
    kv.backends = flags.kv_backends;
    kv.blocks = flags.kv_blocks;
    kv.block_bytes = flags.kv_block_bytes;
    kv.layers = flags.kv_layers;
    kv.hold = std::chrono::milliseconds(flags.kv_hold_ms);
    kv.transfer_timeout = std::chrono::milliseconds(flags.kv_timeout_ms);
    std::unique_ptr<sim::EngineKvMover> engine_mover;
    if (Status s = sim::EngineKvMover::create(kv, &engine_mover); !s.is_ok()) {
      pdr::log::error("cannot start the KV transfer engine (--kv-backends {}): {}", flags.kv_backends,
                    s.to_string());
      return kExitRuntime;
    }
    // Bound side-channel ports (0 asked for ephemeral ones) are what gets advertised.
    options.node = engine_mover->node();
    // The first side-channel port the dialect binds.
    const sim::SimDialect& dialect = *sim::find_sim_dialect(options.node);
    kv_listen_port = options.node.*dialect.side_channel(options.node).front().base;
    mover = std::move(engine_mover);
  }
  std::optional<sim::SimKvEventsPublisherOptions> events_options;
  sim::SimCacheOptions cache_options;
  cache_options.ranks = options.node.dp_size;
  cache_options.block_tokens = options.engine            ? options.engine->profile.block_size
                              : flags.kv_block_tokens != 0 ? flags.kv_block_tokens
                                                           : kDefaultBlockTokens;
  cache_options.capacity_blocks =
      flags.prefix_cache_blocks != 0 ? flags.prefix_cache_blocks : flags.kv_blocks;
  if (!sim::parse_kv_events_encoding(flags.kv_events_encoding, &cache_options.events.encoding)) {
    std::fprintf(stderr, "pdnode sim: error: --kv-events-encoding '%s': expected map or array\n",
                 flags.kv_events_encoding.c_str());
    return kExitBadFlags;
  }
  if (std::string why; !sim::parse_kv_events_groups(flags.kv_events_groups, &cache_options.events.groups, &why)) {
    std::fprintf(stderr, "pdnode sim: error: --kv-events-groups: %s\n", why.c_str());
    return kExitBadFlags;
  }
  if (!sim::parse_kv_events_cpu_tier(flags.kv_events_cpu_tier, &cache_options.events.cpu_tier)) {
    std::fprintf(stderr,
                 "pdnode sim: error: --kv-events-cpu-tier '%s': expected none, self-describing or placeholder\n",
                 flags.kv_events_cpu_tier.c_str());
    return kExitBadFlags;
  }
  if (FlagError e = build_kv_events(flags, options, &events_options); !e.empty()) {
    std::fprintf(stderr, "pdnode sim: error: %s\nRun 'pdnode sim --help' for usage.\n", e.c_str());
    return kExitBadFlags;
  }
  std::unique_ptr<sim::SimKvEventsPublisher> publisher;
  std::optional<proto::HostPort> kv_events, kv_events_replay;
  std::vector<uint16_t> kv_events_ports, kv_events_replay_ports;  // listed: not at port + r
  if (events_options) {
    publisher = std::make_unique<sim::SimKvEventsPublisher>();
    if (Status s = publisher->start(*events_options); !s.is_ok()) {
      pdr::log::error("cannot publish KV events (--kv-events-endpoint {}): {}",
                    flags.kv_events_endpoint, s.to_string());
      return kExitRuntime;
    }
    const std::string& bound = events_options->host;
    const std::string host = bound == "*" || bound == "0.0.0.0" || bound == "::"
                                 ? options.node.advertise_host
                                 : bound;
    kv_events = proto::HostPort{host, publisher->ports().front()};
    if (!publisher->replay_ports().empty()) {
      kv_events_replay = proto::HostPort{host, publisher->replay_ports().front()};
    }
    // Ephemeral ports are each rank's own, which port + r does not find: listed.
    if (events_options->ranks > 1 && events_options->port == 0) kv_events_ports = publisher->ports();
    if (events_options->ranks > 1 && events_options->replay_port == uint16_t{0}) {
      kv_events_replay_ports = publisher->replay_ports();
    }
  }
  options.cache = std::make_shared<sim::SimCacheModel>(cache_options, std::move(publisher));
  sim::SimServer server(options, std::move(mover));
  if (Status s = server.start(); !s.is_ok()) {
    pdr::log::error("cannot start: {}", s.to_string());
    return kExitRuntime;
  }
  // start() filled in the port; keep the identity the server uses for the registration.
  options.node.http_port = server.port();
  options.node.engine_id = server.engine_id();

  std::unique_ptr<sidecar::NodeClient> client;
  if (!flags.register_endpoints.empty()) {
    sidecar::NodeClientOptions client_options;
    client_options.router_endpoints = flags.register_endpoints;
    client_options.registration =
        build_registration(flags, server, options, kv_events, kv_events_replay,
                           kv_events_ports, kv_events_replay_ports);
    client_options.interval = std::chrono::milliseconds(flags.register_interval_ms);
    client = std::make_unique<sidecar::NodeClient>(std::move(client_options));
    if (Status s = client->start(); !s.is_ok()) {
      pdr::log::error("cannot register: {}", s.to_string());
      server.stop();
      return kExitRuntime;
    }
  }

  const proto::HostPort bound{options.host, server.port()};
  std::string line = "pdnode sim listening http=" + bound.to_string();
  if (auto port = server.bootstrap_port()) {
    line += " bootstrap=" + proto::HostPort{options.host, *port}.to_string();
  }
  if (kv_listen_port) line += " kv=" + proto::HostPort{options.host, *kv_listen_port}.to_string();
  if (kv_events) line += " kv_events=" + proto::zmq_tcp_endpoint(*kv_events);
  if (kv_events_replay) line += " kv_events_replay=" + proto::zmq_tcp_endpoint(*kv_events_replay);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);

  std::mutex mutex;
  std::condition_variable stopped_cv;
  bool stopped = false;
  StopSignals signals([&](std::string_view name) {
    pdr::log::info("received {}, stopping", name);
    std::lock_guard<std::mutex> lock(mutex);
    stopped = true;
    stopped_cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    stopped_cv.wait(lock, [&] { return stopped; });
  }
  if (client) client->stop(/*send_goodbye=*/true);
  server.stop();
  return 0;
}

}  // namespace pdr::node
