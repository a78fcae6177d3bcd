// The rules every operator-described instance obeys, whatever it was written in: the topology
// file's `instances:` (YAML, topology_loader.cc) and the admin API's POST /admin/instances (JSON,
// router/admin_request.cc). Both readers turn their syntax into a StaticInstance and call these
// checks, so a node accepted by one is accepted by the other with the same message when refused.
//
// Pure functions, no I/O. Errors carry no position; the caller prefixes the field name or the
// file position it knows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "discovery/config/topology.h"
#include "proto/base/status.h"

namespace pdr::config {

inline constexpr uint32_t kMaxParallelSize = 1024;  // dp_size and tp_size: 1..kMaxParallelSize
inline constexpr size_t kMaxLabels = 32;
inline constexpr size_t kMaxLabelKeyBytes = 64;
inline constexpr size_t kMaxLabelValueBytes = 256;
inline constexpr size_t kMaxEngineIdBytes = 256;  // engine_id

// Named values. kInvalidValue with "unknown role 'x' (expected prefill or decode)" style messages.
// A connector must be a real one ("unknown" is refused); its names and the list the message
// gives come from proto/connectors.h.
Status parse_instance_role(std::string_view text, proto::Role* out);
Status parse_instance_connector(std::string_view text, proto::Connector* out);
// A node's own connector: one of those, or "none" (Connector::kUnknown) for a node with no KV
// connector (a GPU-less `vllm launch render` node, a pooling model): it is never paired for P/D
// (discovery/routable_index.cc skips it) and serves only the one-node endpoints its `serves`
// label names (router/proxy/one_node_relay.h).
Status parse_node_connector(std::string_view text, proto::Connector* out);
Status parse_instance_transfer_mode(std::string_view text, proto::TransferMode* out);

// Which optional keys the operator wrote (a written default differs from an absent key).
struct InstanceKeysGiven {
  bool zmq_address = false;
  bool transfer_mode = false;
};

// The connector-dependent rules, applied once every field is read: MoRIIO needs its composite
// zmq_address and a transfer mode (defaulted from `defaults` when absent), P2P-NCCL a host:port
// zmq_address and no transfer mode; a Mooncake prefill gets the default bootstrap port; a NIXL push
// prefill needs a host:port zmq_address (its side channel) and an engine_id. Completes
// `inst` in place. On error `*field` names the key to blame ("zmq_address", "transfer_mode"), or
// is empty when the instance as a whole is at fault (a required key is missing).
Status check_instance_connector_fields(const Topology::Connectors& defaults, InstanceKeysGiven given,
                                       StaticInstance* inst, std::string_view* field);

}  // namespace pdr::config
