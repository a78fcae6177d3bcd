// Shared instance rules; contracts in instance_spec.h.
#include "config/instance_spec.h"

#include <fmt/format.h>

#include "config/yaml_reader.h"

namespace pdr::discovery {

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
                                                       quoted_excerpt(text), kConnectorNames));
}

Status parse_instance_transfer_mode(std::string_view text, proto::TransferMode* out) {
  if (proto::parse_transfer_mode(text, out)) return Status::ok();
  return Status(StatusCode::kInvalidValue,
                fmt::format("unknown transfer mode {} (expected READ, WRITE or none)",
                            quoted_excerpt(text)));
}

Status check_instance_connector_fields(const Topology::Connectors& defaults, InstanceKeysGiven given,
                                       StaticInstance* inst, std::string_view* field) {
  *field = {};
  switch (inst->connector) {
    case proto::Connector::kMoriio: {
      if (!given.zmq_address) {
        return Status(StatusCode::kMissingKey,
                      "connector moriio needs zmq_address (\"host:IP,handshake:PORT,notify:PORT\")");
      }
      proto::MoriioZmqAddress parsed;
      if (Status s = proto::parse_moriio_zmq_address(inst->zmq_address, &parsed); !s) {
        *field = "zmq_address";
        return s;
      }
      if (!given.transfer_mode) inst->transfer_mode = defaults.default_transfer_mode;
      if (inst->transfer_mode == proto::TransferMode::kNone) {
        if (given.transfer_mode) *field = "transfer_mode";
        return Status(StatusCode::kInvalidValue, "connector moriio needs transfer_mode READ or WRITE");
      }
      return Status::ok();
    }
    case proto::Connector::kP2pNccl: {
      if (!given.zmq_address) {
        return Status(StatusCode::kMissingKey, "connector p2p-nccl needs zmq_address (\"host:port\")");
      }
      proto::HostPort parsed;
      if (Status s = proto::parse_host_port(inst->zmq_address, &parsed); !s) {
        *field = "zmq_address";
        return s;
      }
      if (inst->transfer_mode != proto::TransferMode::kNone) {
        *field = "transfer_mode";
        return Status(StatusCode::kInvalidValue, "connector p2p-nccl has no transfer mode");
      }
      return Status::ok();
    }
    case proto::Connector::kMooncake:
      if (inst->role == proto::Role::kPrefill && !inst->bootstrap_port) {
        inst->bootstrap_port = defaults.mooncake_bootstrap_port;
      }
      return Status::ok();
    default:
      return Status::ok();
  }
}

}  // namespace pdr::discovery
