// The connector name table (proto/connectors.h): one row per connector, names and aliases that
// round-trip through to_string / parse_connector, and every dialect's connector named there.
#include "proto/connectors.h"

#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>

#include "proto/dialects/dialect.h"

namespace pdr::proto {
namespace {

std::string upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

TEST(ConnectorTable, OneRowPerConnectorInEnumOrder) {
  std::set<Connector> seen;
  for (size_t i = 0; i < kConnectorTable.size(); ++i) {
    const ConnectorRow& row = kConnectorTable[i];
    EXPECT_EQ(static_cast<size_t>(row.connector), i) << row.name;
    EXPECT_TRUE(seen.insert(row.connector).second) << row.name;
    EXPECT_EQ(connector_row(row.connector), &row);
  }
  EXPECT_EQ(kConnectorTable[0].connector, Connector::kUnknown);
  // A value past the table has no row and is named as unknown.
  const auto past = static_cast<Connector>(kConnectorTable.size());
  EXPECT_EQ(connector_row(past), nullptr);
  EXPECT_EQ(to_string(past), "unknown");
}

TEST(ConnectorTable, NamesAndAliasesAreUniqueAndLowerCase) {
  std::set<std::string> spellings;
  for (const ConnectorRow& row : kConnectorTable) {
    ASSERT_FALSE(row.name.empty());
    EXPECT_TRUE(spellings.insert(std::string(row.name)).second) << row.name;
    for (std::string_view alias : row.aliases) {
      if (alias.empty()) continue;
      EXPECT_TRUE(spellings.insert(std::string(alias)).second) << alias;
    }
  }
  EXPECT_EQ(spellings.count(std::string(kNoConnectorName)), 0u) << "'none' is not a connector";
  for (const std::string& s : spellings) {
    for (char c : s) EXPECT_FALSE(std::isupper(static_cast<unsigned char>(c))) << s;
  }
}

TEST(ConnectorTable, NamesRoundTripAndAliasesResolve) {
  for (const ConnectorRow& row : kConnectorTable) {
    EXPECT_EQ(to_string(row.connector), row.name);
    Connector parsed = row.connector == Connector::kNixl ? Connector::kMoriio : Connector::kNixl;
    ASSERT_TRUE(parse_connector(row.name, &parsed)) << row.name;
    EXPECT_EQ(parsed, row.connector) << row.name;
    ASSERT_TRUE(parse_connector(upper(row.name), &parsed)) << row.name;
    EXPECT_EQ(parsed, row.connector) << row.name;
    for (std::string_view alias : row.aliases) {
      if (alias.empty()) continue;
      parsed = Connector::kUnknown;
      ASSERT_TRUE(parse_connector(alias, &parsed)) << alias;
      EXPECT_EQ(parsed, row.connector) << alias;
      EXPECT_EQ(to_string(parsed), row.name) << alias;
    }
  }
  Connector untouched = Connector::kSglang;
  EXPECT_FALSE(parse_connector("rdma", &untouched));
  EXPECT_FALSE(parse_connector(kNoConnectorName, &untouched));
  EXPECT_FALSE(parse_connector("", &untouched));
  EXPECT_EQ(untouched, Connector::kSglang);
}

// The spellings accepted before the table existed stay accepted.
TEST(ConnectorTable, KeepsEverySpellingAcceptedBefore) {
  const std::pair<std::string_view, Connector> known[] = {
      {"unknown", Connector::kUnknown},   {"moriio", Connector::kMoriio},       {"p2p-nccl", Connector::kP2pNccl},
      {"p2p_nccl", Connector::kP2pNccl},  {"p2pnccl", Connector::kP2pNccl},     {"nixl", Connector::kNixl},
      {"mooncake", Connector::kMooncake}, {"sglang", Connector::kSglang},       {"nixl-push", Connector::kNixlPush},
      {"nixl_push", Connector::kNixlPush}, {"MoRIIO", Connector::kMoriio},     {"P2P-NCCL", Connector::kP2pNccl},
  };
  for (const auto& [text, connector] : known) {
    Connector parsed = Connector::kUnknown;
    ASSERT_TRUE(parse_connector(text, &parsed)) << text;
    EXPECT_EQ(parsed, connector) << text;
  }
  EXPECT_EQ(kv_connector_names(), "moriio, p2p-nccl, nixl, mooncake, sglang, nixl-push");
}

// Every row but kUnknown is a connector the router can pair (it has a dialect), and every
// dialect's connector has a row: a new connector needs both.
TEST(ConnectorTable, MatchesTheDialectTable) {
  for (const ConnectorRow& row : kConnectorTable) {
    if (row.connector == Connector::kUnknown) {
      EXPECT_EQ(any_dialect_of(row.connector), nullptr);
    } else {
      EXPECT_NE(any_dialect_of(row.connector), nullptr) << row.name << " has no dialect";
      EXPECT_NE(kv_connector_names().find(row.name), std::string::npos) << row.name;
    }
  }
  for (const Dialect* d : all_dialects()) {
    const ConnectorRow* row = connector_row(d->connector);
    ASSERT_NE(row, nullptr) << d->name << " has no connector row";
    EXPECT_NE(row->connector, Connector::kUnknown) << d->name;
    // A dialect is named after its connector (plus its mode, for connectors with modes).
    EXPECT_EQ(d->name.substr(0, row->name.size()), row->name) << d->name;
  }
}

}  // namespace
}  // namespace pdr::proto
