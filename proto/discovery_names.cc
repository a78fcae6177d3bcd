// The text names of node and discovery enums used in /status, the topology file and CLI flags
// (contracts: node_spec.h, discovery_message.h; the connectors' names come from connectors.h's
// table). The decoder also uses the parsers for wire values.
#include <string>
#include <string_view>
#include <utility>

#include "proto/base/ascii.h"
#include "proto/connectors.h"
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
  const ConnectorRow* row = connector_row(connector);
  return row != nullptr ? row->name : kConnectorTable[0].name;
}

const std::string& kv_connector_names() {
  static const std::string names = [] {
    std::string out;
    for (const ConnectorRow& row : kConnectorTable) {
      if (row.connector == Connector::kUnknown) continue;
      if (!out.empty()) out += ", ";
      out += row.name;
    }
    return out;
  }();
  return names;
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
  for (const ConnectorRow& row : kConnectorTable) {
    bool match = name == row.name;
    for (std::string_view alias : row.aliases) match = match || (!alias.empty() && name == alias);
    if (match) {
      *out = row.connector;
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
