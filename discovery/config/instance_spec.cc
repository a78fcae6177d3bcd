// Shared instance rules; contracts in instance_spec.h.
#include "discovery/config/instance_spec.h"

#include <fmt/format.h>

#include "discovery/config/yaml_reader.h"
#include "proto/connectors.h"
#include "proto/dialects/dialect.h"

namespace pdr::config {

using yaml::quoted_excerpt;

Status parse_instance_role(std::string_view text, proto::Role* out) {
  if (proto::parse_role(text, out)) return Status::ok();
  return Status(StatusCode::kInvalidValue,
                fmt::format("unknown role {} (expected prefill or decode)", quoted_excerpt(text)));
}

Status parse_instance_connector(std::string_view text, proto::Connector* out) {
  proto::Connector parsed;
  if (proto::parse_connector(text, &parsed) && parsed != proto::Connector::kUnknown) {
    *out = parsed;
    return Status::ok();
  }
  return Status(StatusCode::kInvalidValue, fmt::format("unknown connector {} (expected {})",
                                                       quoted_excerpt(text), proto::kv_connector_names()));
}

Status parse_node_connector(std::string_view text, proto::Connector* out) {
  if (text == proto::kNoConnectorName) {
    *out = proto::Connector::kUnknown;
    return Status::ok();
  }
  proto::Connector parsed;
  if (proto::parse_connector(text, &parsed) && parsed != proto::Connector::kUnknown) {
    *out = parsed;
    return Status::ok();
  }
  return Status(StatusCode::kInvalidValue,
                fmt::format("unknown connector {} (expected {} or {})", quoted_excerpt(text), proto::kv_connector_names(),
                            proto::kNoConnectorName));
}

Status parse_instance_transfer_mode(std::string_view text, proto::TransferMode* out) {
  if (proto::parse_transfer_mode(text, out)) return Status::ok();
  return Status(StatusCode::kInvalidValue,
                fmt::format("unknown transfer mode {} (expected READ, WRITE or none)",
                            quoted_excerpt(text)));
}

// The rules come from the connector's dialects (proto/dialects/dialect.h): the zmq_address form
// they need, whether they tell instances apart by transfer mode, and whether a prefill gets the
// default bootstrap port.
Status check_instance_connector_fields(const Topology::Connectors& defaults, InstanceKeysGiven given,
                                       StaticInstance* inst, std::string_view* field) {
  *field = {};
  const proto::Dialect* dialect = proto::any_dialect_of(inst->connector);
  if (dialect == nullptr) return Status::ok();
  const std::string_view name = proto::to_string(inst->connector);
  const bool has_modes = proto::pairing_mode(inst->connector, proto::TransferMode::kRead) != proto::TransferMode::kNone;
  switch (dialect->zmq_address) {
    case proto::ZmqAddressForm::kMoriio: {
      if (!given.zmq_address) {
        return Status(StatusCode::kMissingKey,
                      fmt::format("connector {} needs zmq_address (\"host:IP,handshake:PORT,notify:PORT\")", name));
      }
      proto::MoriioZmqAddress parsed;
      if (Status s = proto::parse_moriio_zmq_address(inst->zmq_address, &parsed); !s) {
        *field = "zmq_address";
        return s;
      }
      break;
    }
    case proto::ZmqAddressForm::kHostPort: {
      if (!given.zmq_address) {
        return Status(StatusCode::kMissingKey, fmt::format("connector {} needs zmq_address (\"host:port\")", name));
      }
      proto::HostPort parsed;
      if (Status s = proto::parse_host_port(inst->zmq_address, &parsed); !s) {
        *field = "zmq_address";
        return s;
      }
      break;
    }
    case proto::ZmqAddressForm::kPrefillHostPort: {
      if (!given.zmq_address) {
        if (inst->role != proto::Role::kPrefill) break;
        return Status(StatusCode::kMissingKey,
                      fmt::format("a {} prefill needs zmq_address (its KV side channel, \"host:port\")", name));
      }
      proto::HostPort parsed;
      if (Status s = proto::parse_host_port(inst->zmq_address, &parsed); !s) {
        *field = "zmq_address";
        return s;
      }
      break;
    }
    case proto::ZmqAddressForm::kNone:
      break;
  }
  if (dialect->prefill_needs_engine_id && inst->role == proto::Role::kPrefill && inst->engine_id.empty()) {
    return Status(StatusCode::kMissingKey,
                  fmt::format("a {} prefill needs engine_id (its kv_transfer_config engine_id)", name));
  }
  if (has_modes) {
    if (!given.transfer_mode) inst->transfer_mode = defaults.default_transfer_mode;
    if (proto::dialect_for(inst->connector, inst->transfer_mode) == nullptr) {
      if (given.transfer_mode) *field = "transfer_mode";
      return Status(StatusCode::kInvalidValue, fmt::format("connector {} needs transfer_mode READ or WRITE", name));
    }
  } else if (dialect->zmq_address != proto::ZmqAddressForm::kNone &&
             inst->transfer_mode != proto::TransferMode::kNone) {
    // A connector that uses zmq_address but has no modes (P2P-NCCL) refuses one: it is a
    // likely mix-up with MoRIIO's.
    *field = "transfer_mode";
    return Status(StatusCode::kInvalidValue, fmt::format("connector {} has no transfer mode", name));
  }
  if (dialect->prefill_bootstrap_port_default && inst->role == proto::Role::kPrefill && !inst->bootstrap_port) {
    inst->bootstrap_port = defaults.mooncake_bootstrap_port;
  }
  return Status::ok();
}

}  // namespace pdr::config
