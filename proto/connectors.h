// The one table of KV connector names: each proto::Connector value with the name pdrouter writes
// (/status, the topology file, POST /admin/instances, the pdrouter registration's `connector`
// key, `pdnode --connector`) and the other spellings it accepts. to_string(Connector),
// parse_connector() and every "expected ..." list in an error message are read from this table,
// so a new connector is one enumerator and one row here, and its dialect plug-in
// (proto/dialects/dialect.h: what the router does differently for it) plus the simulator's
// (node/sim/dialect.h). tests/proto/connectors_test.cc walks the table.
//
// Which registration formats imply a connector without naming it (vLLM's MoRIIO and P2P-NCCL
// discovery messages, told apart by their zmq_address shape) is wire knowledge of those formats
// and stays in discovery_decode.cc.
//
// Plain data; no I/O.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pdr::proto {

// A node's KV connector, i.e. the dialect its legs speak. kUnknown: not said, or no connector.
enum class Connector : uint8_t { kUnknown, kMoriio, kP2pNccl, kNixl, kMooncake, kSglang, kNixlPush };

struct ConnectorRow {
  Connector connector;
  std::string_view name;  // lower case; what to_string() returns
  // Other spellings parse_connector() accepts (any case, like the name); "" = unused slot.
  std::array<std::string_view, 2> aliases;
};

// One row per enumerator, in enumerator order (checked below). kUnknown's "unknown" is the
// "not said" value: the topology and the admin API refuse it, a pdrouter registration infers
// the connector from its zmq_address instead.
inline constexpr auto kConnectorTable = std::to_array<ConnectorRow>({
    {Connector::kUnknown, "unknown", {}},
    {Connector::kMoriio, "moriio", {}},
    {Connector::kP2pNccl, "p2p-nccl", {"p2p_nccl", "p2pnccl"}},
    {Connector::kNixl, "nixl", {}},
    {Connector::kMooncake, "mooncake", {}},
    {Connector::kSglang, "sglang", {}},
    {Connector::kNixlPush, "nixl-push", {"nixl_push"}},  // vLLM's NixlPushConnector
});

// What a node with no KV connector says where a connector name goes (topology, admin API,
// registration): it is stored as kUnknown and never paired.
inline constexpr std::string_view kNoConnectorName = "none";

constexpr bool connector_table_in_enum_order() {
  for (size_t i = 0; i < kConnectorTable.size(); ++i) {
    if (static_cast<size_t>(kConnectorTable[i].connector) != i) return false;
  }
  return true;
}
static_assert(connector_table_in_enum_order(), "kConnectorTable: one row per Connector, in enum order");

// The row of `connector`, or nullptr for a value past the table.
constexpr const ConnectorRow* connector_row(Connector connector) {
  const size_t i = static_cast<size_t>(connector);
  return i < kConnectorTable.size() ? &kConnectorTable[i] : nullptr;
}

// The real connectors' names in table order, comma separated:
// "moriio, p2p-nccl, nixl, mooncake, sglang, nixl-push" (for "expected ..." messages).
const std::string& kv_connector_names();

}  // namespace pdr::proto
