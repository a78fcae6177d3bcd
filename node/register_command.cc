#include "node/register_command.h"
#include "node/logging.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include <CLI/CLI.hpp>
#include "proto/base/log.h"

#include "proto/curve_keys.h"
#include "discovery/sidecar/sidecar.h"
#include "discovery/config/topology_secrets.h"
#include "node/stop_signals.h"

namespace pdr::node {
namespace {

constexpr int kExitBadFlags = 2;
constexpr size_t kMaxLabels = 32;
constexpr size_t kMaxLabelKey = 64;
constexpr size_t kMaxLabelValue = 256;

using proto::RegistrationFormat;

// An error message for the user, or empty when the flag is fine.
using FlagError = std::string;

FlagError check_router_endpoint(const std::string& endpoint) {
  constexpr std::string_view kTcp = "tcp://";
  constexpr std::string_view kIpc = "ipc://";
  std::string_view text = endpoint;
  if (text.starts_with(kIpc) && text.size() > kIpc.size()) return "";
  if (!text.starts_with(kTcp)) {
    return "--router '" + endpoint + "': expected tcp://HOST:PORT (or ipc://PATH)";
  }
  proto::HostPort address;
  if (Status s = proto::parse_host_port(text.substr(kTcp.size()), &address); !s.is_ok()) {
    return "--router '" + endpoint + "': " + s.message();
  }
  return "";
}

FlagError parse_labels(const std::vector<std::string>& items, proto::Labels* out) {
  if (items.size() > kMaxLabels) return "--label: at most 32 labels";
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return "--label '" + item + "': expected KEY=VALUE";
    std::string key = item.substr(0, eq);
    std::string value = item.substr(eq + 1);
    if (key.size() > kMaxLabelKey) return "--label '" + item + "': key longer than 64 characters";
    if (value.size() > kMaxLabelValue) {
      return "--label '" + item + "': value longer than 256 characters";
    }
    out->emplace_back(std::move(key), std::move(value));
  }
  std::sort(out->begin(), out->end());
  auto duplicate = std::adjacent_find(out->begin(), out->end(),
                                      [](const auto& a, const auto& b) { return a.first == b.first; });
  if (duplicate != out->end()) return "--label: key '" + duplicate->first + "' given twice";
  return "";
}

// Fills the KV-side address fields the chosen wire format needs from --zmq-address.
FlagError apply_zmq_address(const RegisterFlags& flags, proto::Registration* reg) {
  reg->zmq_address = flags.zmq_address;
  const bool moriio_format = reg->format == RegistrationFormat::kMoriio ||
                             reg->format == RegistrationFormat::kMoriioLegacy;
  if (flags.zmq_address.empty()) {
    if (reg->format == RegistrationFormat::kPdrouter) return "";
    return "--zmq-address is required for --format " + std::string(to_string(reg->format));
  }
  if (moriio_format || (reg->format == RegistrationFormat::kPdrouter &&
                        proto::looks_like_moriio_zmq_address(flags.zmq_address))) {
    proto::MoriioZmqAddress moriio;
    if (Status s = proto::parse_moriio_zmq_address(flags.zmq_address, &moriio); !s.is_ok()) {
      return "--zmq-address '" + flags.zmq_address +
             "': expected host:IP,handshake:PORT,notify:PORT (" + s.message() + ")";
    }
    reg->moriio_zmq = moriio;
    return "";
  }
  proto::HostPort kv;
  if (Status s = proto::parse_host_port(flags.zmq_address, &kv); !s.is_ok()) {
    return "--zmq-address '" + flags.zmq_address + "': expected HOST:PORT (" + s.message() + ")";
  }
  reg->kv_address = kv;
  return "";
}

FlagError apply_transfer_mode(const RegisterFlags& flags, proto::Registration* reg) {
  const bool moriio_format = reg->format == RegistrationFormat::kMoriio ||
                             reg->format == RegistrationFormat::kMoriioLegacy;
  if (flags.transfer_mode.empty()) {
    if (moriio_format) {
      return "--transfer-mode READ|WRITE is required for --format " +
             std::string(to_string(reg->format));
    }
    return "";
  }
  if (reg->format == RegistrationFormat::kP2pNccl) {
    return "--transfer-mode: the p2p-nccl format has no transfer mode";
  }
  if (!proto::parse_transfer_mode(flags.transfer_mode, &reg->transfer_mode) ||
      reg->transfer_mode == proto::TransferMode::kNone) {
    return "--transfer-mode '" + flags.transfer_mode + "': expected READ or WRITE";
  }
  return "";
}

FlagError apply_connector(const RegisterFlags& flags, proto::Registration* reg) {
  switch (reg->format) {
    case RegistrationFormat::kMoriio:
    case RegistrationFormat::kMoriioLegacy: reg->connector = proto::Connector::kMoriio; break;
    case RegistrationFormat::kP2pNccl: reg->connector = proto::Connector::kP2pNccl; break;
    default: break;
  }
  if (flags.connector.empty()) return "";
  proto::Connector connector;
  if (!proto::parse_connector(flags.connector, &connector) ||
      connector == proto::Connector::kUnknown) {
    return "--connector '" + flags.connector +
           "': expected moriio, p2p-nccl, nixl, mooncake, sglang or nixl-push";
  }
  if (reg->format != RegistrationFormat::kPdrouter && connector != reg->connector) {
    return "--connector " + flags.connector + " contradicts --format " +
           std::string(to_string(reg->format)) + " (only the pdrouter format carries a connector)";
  }
  reg->connector = connector;
  return "";
}

// Flags that only the pdrouter extension can carry; plain vLLM dialects would drop them silently.
FlagError reject_extension_flags_for_plain_format(const RegisterFlags& flags) {
  const std::pair<bool, const char*> extension_flags[] = {
      {flags.bootstrap_port != 0, "--bootstrap-port"}, {!flags.model.empty(), "--model"},
      {!flags.engine_id.empty(), "--engine-id"},        {flags.pp_size != 0, "--pp-size"},
      {!flags.kv_events_endpoint.empty(), "--kv-events-endpoint"},
      {!flags.kv_events_replay_endpoint.empty(), "--kv-events-replay-endpoint"},
      {!flags.labels.empty(), "--label"},              {flags.ttl_ms != 0, "--ttl-ms"},
      {!flags.auth_token_env.empty(), "--auth-token-env"},
  };
  for (const auto& [given, name] : extension_flags) {
    if (given) {
      return std::string(name) + " needs --format pdrouter (the " + flags.format +
             " format has no such field)";
    }
  }
  return "";
}

FlagError parse_kv_events_endpoint(const char* flag, const std::string& text,
                                   std::optional<proto::HostPort>* out) {
  if (text.empty()) return "";
  proto::HostPort endpoint;
  if (Status s = proto::parse_zmq_tcp_endpoint(text, &endpoint); !s) {
    return std::string(flag) + " '" + text + "': " + s.message();
  }
  *out = endpoint;
  return "";
}

FlagError apply_extension(const RegisterFlags& flags, proto::Registration* reg) {
  if (reg->format != RegistrationFormat::kPdrouter) {
    return reject_extension_flags_for_plain_format(flags);
  }
  reg->schema_version = 1;
  reg->model = flags.model;
  if (flags.bootstrap_port != 0) reg->bootstrap_port = static_cast<uint16_t>(flags.bootstrap_port);
  reg->engine_id = flags.engine_id;
  if (flags.pp_size != 0) reg->pp_size = flags.pp_size;
  if (flags.ttl_ms != 0) reg->ttl_ms = flags.ttl_ms;
  if (FlagError e = parse_kv_events_endpoint("--kv-events-endpoint", flags.kv_events_endpoint,
                                             &reg->kv_events_endpoint);
      !e.empty()) {
    return e;
  }
  if (FlagError e = parse_kv_events_endpoint("--kv-events-replay-endpoint",
                                             flags.kv_events_replay_endpoint,
                                             &reg->kv_events_replay_endpoint);
      !e.empty()) {
    return e;
  }
  if (FlagError e = parse_labels(flags.labels, &reg->labels); !e.empty()) return e;
  if (!flags.auth_token_env.empty()) {
    const char* token = std::getenv(flags.auth_token_env.c_str());
    if (token == nullptr || *token == '\0') {
      return "--auth-token-env " + flags.auth_token_env + ": that environment variable is unset or empty";
    }
    reg->auth_token = token;
  }
  return "";
}

FlagError build_registration(const RegisterFlags& flags, proto::Registration* reg) {
  if (!proto::parse_registration_format(flags.format, &reg->format) ||
      reg->format == RegistrationFormat::kStatic) {
    return "--format '" + flags.format + "': expected pdrouter, moriio, moriio-legacy or p2p-nccl";
  }
  if (!proto::parse_role(flags.role, &reg->role)) {
    return "--role '" + flags.role + "': expected prefill or decode";
  }
  if (Status s = proto::parse_host_port(flags.http_address, &reg->http_address); !s.is_ok()) {
    return "--http-address '" + flags.http_address + "': " + s.message();
  }
  if (flags.dp_size != 0) reg->dp_size = flags.dp_size;
  if (flags.tp_size != 0) reg->tp_size = flags.tp_size;
  if (reg->format == RegistrationFormat::kP2pNccl && (flags.dp_size != 0 || flags.tp_size != 0)) {
    return "--dp-size/--tp-size: the p2p-nccl format has no such fields";
  }
  for (auto apply : {apply_zmq_address, apply_transfer_mode, apply_connector, apply_extension}) {
    if (FlagError e = apply(flags, reg); !e.empty()) return e;
  }
  // The router's own decoder is the judge: a registration it would refuse on every heartbeat is a
  // flag error here, not a silent loop of rejected messages.
  proto::DiscoveryMessage decoded;
  const std::string wire = proto::encode_registration(*reg);
  if (Status s = proto::decode_discovery_message(proto::as_bytes(wire), proto::DecodeLimits{}, &decoded);
      !s.is_ok()) {
    return "the router would reject this registration: " + s.to_string();
  }
  return "";
}

// Reads a key file given on the command line (at most 64 KiB).
FlagError read_key_file(const std::string& flag, const std::string& path, std::string* text) {
  Status s = config::read_small_file(path, 64 * 1024, text);
  return s ? "" : flag + " '" + path + "': " + s.message();
}

FlagError load_curve_flags(const RegisterFlags& flags, sidecar::NodeClientOptions* client) {
  if (flags.curve_server_key_file.empty()) {
    return flags.curve_key_file.empty() ? "" : "--curve-key needs --curve-server-key";
  }
  std::string text;
  if (FlagError e = read_key_file("--curve-server-key", flags.curve_server_key_file, &text); !e.empty()) return e;
  if (Status s = proto::parse_curve_public_key(text, &client->curve_server_key); !s.is_ok()) {
    return "--curve-server-key '" + flags.curve_server_key_file + "': " + s.message();
  }
  if (flags.curve_key_file.empty()) return "";  // ephemeral client key: encrypted, address-admitted
  if (FlagError e = read_key_file("--curve-key", flags.curve_key_file, &text); !e.empty()) return e;
  proto::CurveKeyPair keys;
  if (Status s = proto::parse_curve_secret_key(text, &keys); !s.is_ok()) {
    return "--curve-key '" + flags.curve_key_file + "': " + s.message();
  }
  client->curve_public_key = keys.public_z85;
  client->curve_secret_key = keys.secret_z85;
  return "";
}

FlagError build_sidecar_options(const RegisterFlags& flags, sidecar::SidecarOptions* options) {
  for (const std::string& endpoint : flags.routers) {
    if (FlagError e = check_router_endpoint(endpoint); !e.empty()) return e;
  }
  options->client.router_endpoints = flags.routers;
  if (FlagError e = build_registration(flags, &options->client.registration); !e.empty()) return e;
  options->client.interval = std::chrono::milliseconds(flags.interval_ms);
  if (FlagError e = load_curve_flags(flags, &options->client); !e.empty()) return e;
  options->health_interval = std::chrono::milliseconds(flags.health_interval_ms);
  const std::string url =
      flags.health_url.empty() ? "http://" + flags.http_address + "/health" : flags.health_url;
  // One probe may use the whole slot between probes, no more.
  if (Status s = sidecar::HealthProbe::from_url(url, options->health_interval, &options->health);
      !s.is_ok()) {
    return "--health-url '" + url + "': " + s.message();
  }
  return "";
}


}  // namespace

std::string parse_label_flags(const std::vector<std::string>& items, proto::Labels* out) {
  return parse_labels(items, out);
}

CLI::App* add_register_command(CLI::App& app, RegisterFlags* f) {
  CLI::App* cmd = app.add_subcommand(
      "register",
      "Register an unmodified vLLM node with one or more pdrouter instances (a sidecar).\n"
      "Waits until the node's health URL answers 200, then heartbeats its registration every\n"
      "--interval-ms; pauses heartbeats while health fails (the router then expires the node) and\n"
      "resumes when it recovers. On SIGTERM/SIGINT it sends a goodbye (pdrouter format) and exits 0.\n"
      "Exit codes: 0 clean stop, 1 runtime failure, 2 bad flags.");
  cmd->add_option("--router", f->routers,
                  "Router discovery endpoint, e.g. tcp://10.0.0.1:36367. Repeat the flag to register "
                  "with several router replicas.")
      ->required()
      ->type_name("ENDPOINT");
  cmd->add_option("--role", f->role, "Role of the node: prefill or decode (P/D also accepted).")
      ->required()
      ->type_name("prefill|decode");
  cmd->add_option("--http-address", f->http_address,
                  "The vLLM node's OpenAI API address as HOST:PORT (no scheme), e.g. 10.0.0.5:8000. "
                  "It is the router's key for this node.")
      ->required()
      ->type_name("HOST:PORT");
  cmd->add_option("--format", f->format,
                  "Wire format of the heartbeat: pdrouter (MoRIIO keys plus pdrouter's extension, "
                  "acknowledged, with goodbye), moriio (vLLM MoRIIO connector), moriio-legacy "
                  "(older MoRIIO releases / vllm-project/router) or p2p-nccl (vLLM P2P-NCCL).")
      ->capture_default_str()
      ->type_name("FORMAT");
  cmd->add_option("--connector", f->connector,
                  "KV connector of the node: moriio, p2p-nccl, nixl, mooncake, sglang or nixl-push. Implied by "
                  "the moriio and p2p-nccl formats; sent only in the pdrouter format.")
      ->type_name("NAME");
  cmd->add_option("--zmq-address", f->zmq_address,
                  "The node's KV-transfer address, sent verbatim. MoRIIO formats: "
                  "host:IP,handshake:PORT,notify:PORT; p2p-nccl: IP:PORT. Required except for the "
                  "pdrouter format.")
      ->type_name("STR");
  cmd->add_option("--dp-size", f->dp_size, "Data-parallel size of the node (default 1).")
      ->check(CLI::Range(1, 1024))
      ->type_name("N");
  cmd->add_option("--tp-size", f->tp_size, "Tensor-parallel size of the node (default 1).")
      ->check(CLI::Range(1, 1024))
      ->type_name("N");
  cmd->add_option("--transfer-mode", f->transfer_mode,
                  "KV transfer mode, READ (decode pulls) or WRITE (prefill pushes). Required for the "
                  "MoRIIO formats; not allowed for p2p-nccl.")
      ->type_name("READ|WRITE");
  cmd->add_option("--bootstrap-port", f->bootstrap_port,
                  "Mooncake/SGLang bootstrap server port (pdrouter format only).")
      ->check(CLI::Range(1, 65535))
      ->type_name("PORT");
  cmd->add_option("--engine-id", f->engine_id,
                  "The node's vLLM kv_transfer_config engine_id; required of a nixl-push prefill, whose "
                  "decodes are sent it (pdrouter format only).")
      ->type_name("ID");
  cmd->add_option("--pp-size", f->pp_size, "Pipeline-parallel size of the node (default 1; pdrouter format only).")
      ->check(CLI::Range(1, 1024))
      ->type_name("N");
  cmd->add_option("--kv-events-endpoint", f->kv_events_endpoint,
                  "Where the router subscribes to the node's vLLM KV cache events: the address "
                  "of its --kv-events-config publisher, tcp://HOST:PORT for DP rank 0 (rank r: "
                  "PORT+r). Not the bind form tcp://*:PORT (pdrouter format only).")
      ->type_name("tcp://HOST:PORT");
  cmd->add_option("--kv-events-replay-endpoint", f->kv_events_replay_endpoint,
                  "The publisher's replay socket (--kv-events-config replay_endpoint), "
                  "tcp://HOST:PORT for DP rank 0 (pdrouter format only).")
      ->type_name("tcp://HOST:PORT");
  cmd->add_option("--model", f->model, "Served model name (pdrouter format only).")
      ->type_name("NAME");
  cmd->add_option("--label", f->labels,
                  "Label KEY=VALUE attached to the node, e.g. zone=a (pdrouter format only; "
                  "repeatable, up to 32).")
      ->type_name("KEY=VALUE");
  cmd->add_option("--interval-ms", f->interval_ms, "Heartbeat period in milliseconds.")
      ->capture_default_str()
      ->check(CLI::Range(10, 3600000))
      ->type_name("MS");
  cmd->add_option("--ttl-ms", f->ttl_ms,
                  "TTL the router should give this node, in milliseconds (pdrouter format only; the "
                  "router clamps it). Default: the router's own TTL.")
      ->check(CLI::Range(1, 86400000))
      ->type_name("MS");
  cmd->add_option("--health-url", f->health_url,
                  "Health URL probed with GET; 200 means healthy. Default: "
                  "http://<http-address>/health.")
      ->type_name("URL");
  cmd->add_option("--health-interval-ms", f->health_interval_ms,
                  "Period of health probes in milliseconds; also each probe's timeout.")
      ->capture_default_str()
      ->check(CLI::Range(10, 3600000))
      ->type_name("MS");
  cmd->add_option("--auth-token-env", f->auth_token_env,
                  "Name of an environment variable holding the router's discovery token; the token "
                  "is sent with every heartbeat (pdrouter format only). The token itself is never "
                  "taken on the command line.")
      ->type_name("VAR");
  cmd->add_option("--curve-server-key", f->curve_server_key_file,
                  "File with the router's CURVE public key (a certificate from 'pdnode keygen' or a "
                  "40-character Z85 line): connect with CURVE, to the router's "
                  "listeners.discovery_curve endpoint.")
      ->type_name("FILE");
  cmd->add_option("--curve-key", f->curve_key_file,
                  "File with this node's CURVE secret key ('pdnode keygen' output); its public key "
                  "must be in the router's discovery.curve.allowed_client_keys_file. Without it an "
                  "ephemeral key is used (encrypted, admitted by address only).")
      ->type_name("FILE");
  add_log_level_option(cmd, &f->log_level);
  return cmd;
}

int run_register_command(const RegisterFlags& flags) {
  sidecar::SidecarOptions options;
  if (FlagError e = build_sidecar_options(flags, &options); !e.empty()) {
    std::fprintf(stderr, "pdnode register: error: %s\nRun 'pdnode register --help' for usage.\n",
                 e.c_str());
    return kExitBadFlags;
  }
  configure_logging(flags.log_level);
  sidecar::Sidecar sidecar(std::move(options));
  StopSignals signals([&sidecar](std::string_view name) {
    pdr::log::info("received {}, stopping", name);
    sidecar.stop();
  });
  return sidecar.run();
}

}  // namespace pdr::node
