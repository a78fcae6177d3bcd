// The text names of node and discovery enums used in /status, the topology file and CLI flags
// (contracts: node_spec.h, discovery_message.h). The decoder also uses the parsers for wire values.
#include <string>
#include <string_view>
#include <utility>

#include "base/ascii.h"
#include "proto/discovery_message.h"

namespace pdr::proto {

namespace {

std::string lower_ascii(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = ascii_lower(c);
  return out;
}

}  // namespace

std::string_view to_string(Role role) { return role == Role::kPrefill ? "prefill" : "decode"; }

std::string_view to_string(TransferMode mode) {
  switch (mode) {
    case TransferMode::kNone: return "none";
    case TransferMode::kRead: return "READ";
    case TransferMode::kWrite: return "WRITE";
  }
  return "none";
}

std::string_view to_string(Connector connector) {
  switch (connector) {
    case Connector::kUnknown: return "unknown";
    case Connector::kMoriio: return "moriio";
    case Connector::kP2pNccl: return "p2p-nccl";
    case Connector::kNixl: return "nixl";
    case Connector::kMooncake: return "mooncake";
    case Connector::kSglang: return "sglang";
    case Connector::kNixlPush: return "nixl-push";
  }
  return "unknown";
}

std::string_view to_string(RegistrationFormat format) {
  switch (format) {
    case RegistrationFormat::kMoriio: return "moriio";
    case RegistrationFormat::kMoriioLegacy: return "moriio-legacy";
    case RegistrationFormat::kP2pNccl: return "p2p-nccl";
    case RegistrationFormat::kPdrouter: return "pdrouter";
    case RegistrationFormat::kStatic: return "static";
  }
  return "static";
}

bool parse_role(std::string_view text, Role* out) {
  const std::string name = lower_ascii(text);
  if (text == "P" || name == "prefill") {
    *out = Role::kPrefill;
    return true;
  }
  if (text == "D" || name == "decode") {
    *out = Role::kDecode;
    return true;
  }
  return false;
}

bool parse_transfer_mode(std::string_view text, TransferMode* out) {
  const std::string name = lower_ascii(text);
  if (name == "read") {
    *out = TransferMode::kRead;
  } else if (name == "write") {
    *out = TransferMode::kWrite;
  } else if (name == "none") {
    *out = TransferMode::kNone;
  } else {
    return false;
  }
  return true;
}

bool parse_connector(std::string_view text, Connector* out) {
  const std::string name = lower_ascii(text);
  static constexpr std::pair<std::string_view, Connector> kNames[] = {
      {"unknown", Connector::kUnknown},   {"moriio", Connector::kMoriio},
      {"p2p-nccl", Connector::kP2pNccl},  {"p2p_nccl", Connector::kP2pNccl},
      {"p2pnccl", Connector::kP2pNccl},   {"nixl", Connector::kNixl},
      {"mooncake", Connector::kMooncake}, {"sglang", Connector::kSglang},
      {"nixl-push", Connector::kNixlPush}, {"nixl_push", Connector::kNixlPush},
  };
  for (const auto& [known, connector] : kNames) {
    if (name == known) {
      *out = connector;
      return true;
    }
  }
  return false;
}

bool parse_registration_format(std::string_view text, RegistrationFormat* out) {
  const std::string name = lower_ascii(text);
  static constexpr std::pair<std::string_view, RegistrationFormat> kNames[] = {
      {"moriio", RegistrationFormat::kMoriio},
      {"moriio-legacy", RegistrationFormat::kMoriioLegacy},
      {"p2p-nccl", RegistrationFormat::kP2pNccl},
      {"pdrouter", RegistrationFormat::kPdrouter},
      {"static", RegistrationFormat::kStatic},
  };
  for (const auto& [known, format] : kNames) {
    if (name == known) {
      *out = format;
      return true;
    }
  }
  return false;
}

}  // namespace pdr::proto
