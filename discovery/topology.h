// The deployment as the operator describes it in YAML, validated into plain structs once.
// Only topology_loader.cc and yaml_reader.{h,cc} touch yaml-cpp. Every field has a default, so an
// empty file is a valid topology. Reference: deploy/topology.example.yaml (every key commented).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "proto/address.h"
#include "proto/discovery_message.h"
#include "proto/status.h"

namespace pdr::discovery {

enum class PolicyName : uint8_t { kRoundRobin, kLeastOutstanding, kPowerOfTwo, kAffinity };
std::string_view to_string(PolicyName);  // "round_robin", "least_outstanding", "power_of_two", "affinity"
bool parse_policy_name(std::string_view, PolicyName*);

struct StaticInstance {
  proto::Role role = proto::Role::kPrefill;
  proto::HostPort http_address;
  proto::Connector connector = proto::Connector::kUnknown;  // default: connectors.default
  proto::TransferMode transfer_mode = proto::TransferMode::kNone;
  std::string zmq_address;                 // optional; validated per connector
  uint32_t dp_size = 1;
  uint32_t tp_size = 1;
  std::optional<uint16_t> bootstrap_port;
  std::string model;
  proto::Labels labels;
};

struct Topology {
  std::string source_path;  // file it was loaded from ("" for defaults)

  struct Listeners {
    proto::HostPort http{"0.0.0.0", 10001};
    std::string discovery = "tcp://*:36367";  // ZMQ endpoint; "tcp://host:0" binds an ephemeral port
  } listeners;

  uint32_t workers = 0;  // HTTP worker loops; 0 = one per core

  struct Discovery {
    std::chrono::milliseconds ttl{5000};            // default instance TTL after its last message
    std::chrono::milliseconds min_ttl{1000};        // bounds for a node-requested ttl_ms
    std::chrono::milliseconds max_ttl{300000};
    std::chrono::milliseconds expired_retention{60000};  // expired entries stay visible this long
    uint32_t max_instances = 4096;
    uint32_t max_message_bytes = 64 * 1024;
    std::string auth_token;        // resolved secret ("" = no authentication)
    std::string auth_token_env;    // where it came from (for /status; never the secret itself)
    bool allow_unauthenticated_vllm = true;  // plain vLLM dialects cannot carry a token
  } discovery;

  struct Policies {
    PolicyName prefill = PolicyName::kRoundRobin;
    PolicyName decode = PolicyName::kRoundRobin;
    std::string affinity_header;   // for kAffinity: hash this header if present
    uint32_t affinity_prefix_bytes = 256;  // else hash the first N bytes of the prompt
  } policies;

  struct Connectors {
    proto::Connector default_connector = proto::Connector::kMoriio;
    proto::TransferMode default_transfer_mode = proto::TransferMode::kWrite;
    uint16_t mooncake_bootstrap_port = 8998;
    std::string upstream_api_key;      // resolved secret sent as Authorization (replaces the client's)
    std::string upstream_api_key_env;  // its source
  } connectors;

  struct Timeouts {
    std::chrono::milliseconds connect{2000};
    std::chrono::milliseconds prefill{60000};
    std::chrono::milliseconds first_byte{60000};
    std::chrono::milliseconds stream_idle{60000};
    std::chrono::milliseconds header_read{10000};
    // A request body must arrive whole within this, counted from the end of its headers (408
    // after it), however often bytes trickle in: bounds how long a slow body holds a connection.
    std::chrono::milliseconds body_read{30000};
    std::chrono::milliseconds keep_alive_idle{60000};
    std::chrono::milliseconds drain{30000};
  } timeouts;

  struct Retries {
    uint32_t prefill_attempts = 2;  // total tries, >= 1
    uint32_t decode_attempts = 2;
    // Passive health (router/proxy/ejection.h): a node is skipped for eject_ms after this many
    // legs in a row could not connect to it; 0 = never.
    uint32_t eject_after_connect_failures = 3;
    std::chrono::milliseconds eject{5000};
  } retries;

  struct Limits {
    uint32_t max_body_bytes = 32 * 1024 * 1024;
    uint32_t max_header_bytes = 64 * 1024;
    uint32_t max_concurrent_requests = 4096;
    uint32_t max_connections = 16384;
  } limits;

  struct Admin {
    std::string api_key;       // resolved secret ("" = admin API disabled)
    std::string api_key_env;   // source: environment variable name
    std::string api_key_file;  // or source: file path
  } admin;

  std::vector<StaticInstance> static_instances;
};

// Parses and validates YAML text. `filename` only labels errors. On error the Status message reads
// "FILE:LINE:COLUMN: KEY.PATH: what is wrong" (1-based line/column of the offending node) and `out`
// is untouched. Secrets named by *_env / *_file keys are resolved here (a missing variable or
// unreadable file is an error). Unknown keys are errors (typos must not pass silently).
Status parse_topology(std::string_view yaml_text, std::string_view filename, Topology* out);
// Reads the file (size limit 1 MiB) then parse_topology.
Status load_topology_file(const std::string& path, Topology* out);

}  // namespace pdr::discovery
