// The simulator's dialect table (node/sim/dialect.h) and each dialect's pure callbacks: what a leg
// must carry, what a prefill answers, which side-channel ports a node binds, what it registers,
// and where a decode looks for its prefill's KV (the parts that need no network). The end-to-end
// behaviour of every dialect is covered by tests/integration (test_sim, test_kv_transfer,
// test_proxy_dialects).
#include "node/sim/dialect.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "node/sim/kv_peer.h"

namespace pdr::node::sim {
namespace {

using nlohmann::json;
using proto::Connector;
using proto::Role;
using proto::TransferMode;

const SimDialect& dialect_of(Connector connector, TransferMode mode = TransferMode::kNone) {
  const SimDialect* d = find_sim_dialect(connector, mode);
  EXPECT_NE(d, nullptr) << proto::to_string(connector) << " " << proto::to_string(mode);
  return d != nullptr ? *d : *sim_dialects().front();
}

KvNodeIdentity node_of(Connector connector, Role role, TransferMode mode = TransferMode::kNone) {
  KvNodeIdentity node;
  node.connector = connector;
  node.transfer_mode = mode;
  node.role = role;
  node.advertise_host = "127.0.0.1";
  node.engine_id = "engine-x";
  return node;
}

std::optional<SimError> check(const KvNodeIdentity& node, const json& body, KvRequest* out,
                              const std::string& request_id = "rid-1",
                              std::optional<std::string> dp_rank = std::nullopt) {
  return check_kv_request(*find_sim_dialect(node), node, request_id, dp_rank, body, out);
}

TEST(SimDialectTable, EveryConnectorHasOneDialectPerMode) {
  std::set<std::pair<Connector, TransferMode>> seen;
  for (const SimDialect* d : sim_dialects()) {
    EXPECT_TRUE(seen.emplace(d->connector, d->transfer_mode).second) << d->name << " twice";
    EXPECT_NE(d->connector, Connector::kUnknown) << d->name;
    EXPECT_NE(d->check_leg, nullptr) << d->name;
    EXPECT_NE(d->prefill_answer, nullptr) << d->name;
    EXPECT_NE(d->side_channel, nullptr) << d->name;
    EXPECT_NE(d->resolve_peer, nullptr) << d->name;
    EXPECT_NE(d->fill_registration, nullptr) << d->name;
    EXPECT_EQ(find_sim_dialect(d->connector, d->transfer_mode), d) << d->name;
  }
  for (Connector c : {Connector::kNixl, Connector::kMoriio, Connector::kMooncake,
                      Connector::kP2pNccl, Connector::kSglang, Connector::kNixlPush}) {
    EXPECT_NE(find_sim_dialect(c, default_transfer_mode(c)), nullptr) << proto::to_string(c);
  }
  EXPECT_EQ(default_transfer_mode(Connector::kMoriio), TransferMode::kRead);
  EXPECT_EQ(default_transfer_mode(Connector::kNixl), TransferMode::kNone);
  EXPECT_EQ(find_sim_dialect(Connector::kMoriio, TransferMode::kNone), nullptr);
  EXPECT_EQ(find_sim_dialect(Connector::kUnknown, TransferMode::kNone), nullptr);
}

TEST(SimDialectTable, MovementAndDefaultPorts) {
  EXPECT_EQ(dialect_of(Connector::kNixl).movement, KvMovement::kPull);
  EXPECT_EQ(dialect_of(Connector::kMoriio, TransferMode::kRead).movement, KvMovement::kPull);
  EXPECT_EQ(dialect_of(Connector::kMoriio, TransferMode::kWrite).movement, KvMovement::kPush);
  EXPECT_EQ(dialect_of(Connector::kMooncake).movement, KvMovement::kPush);
  EXPECT_EQ(dialect_of(Connector::kP2pNccl).movement, KvMovement::kPush);
  EXPECT_EQ(dialect_of(Connector::kSglang).movement, KvMovement::kPush);
  EXPECT_EQ(dialect_of(Connector::kNixlPush).movement, KvMovement::kPush);
  EXPECT_EQ(dialect_of(Connector::kNixlPush).default_kv_port, 5600);
  EXPECT_EQ(dialect_of(Connector::kNixl).default_kv_port, 5600);
  EXPECT_EQ(dialect_of(Connector::kP2pNccl).default_kv_port, 21001);
  EXPECT_EQ(dialect_of(Connector::kMooncake).default_kv_port, 17000);
  EXPECT_NE(dialect_of(Connector::kMooncake).bootstrap_query, nullptr);
  EXPECT_EQ(dialect_of(Connector::kNixl).bootstrap_query, nullptr);
}

TEST(SimDialectCheck, LegFromParamsAndRoleMismatch) {
  KvNodeIdentity node = node_of(Connector::kNixl, Role::kDecode);
  KvRequest r;
  ASSERT_FALSE(check(node, json{{"prompt", "x"}}, &r));
  EXPECT_EQ(r.leg, KvLeg::kPlain);
  auto e = check(node, json{{"kv_transfer_params", {{"do_remote_decode", true}}}}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->reason, "role_mismatch");
  e = check(node, json{{"kv_transfer_params", 3}}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->reason, "bad_kv_transfer_params");
  e = check(node, json::object(), &r, "rid", "1");  // dp_size 1
  ASSERT_TRUE(e);
  EXPECT_EQ(e->reason, "bad_dp_rank");
}

TEST(SimDialectCheck, NixlDecodeNeedsTheReadAddress) {
  KvNodeIdentity node = node_of(Connector::kNixl, Role::kDecode);
  json params{{"do_remote_prefill", true}, {"remote_engine_id", "e"}, {"remote_request_id", "r"},
              {"remote_host", "127.0.10.1"}, {"remote_port", 5601}};
  KvRequest r;
  auto e = check(node, json{{"kv_transfer_params", params}}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->reason, "missing_remote_block_ids");
  params["remote_block_ids"] = json::array({1, 2});
  ASSERT_FALSE(check(node, json{{"kv_transfer_params", params}}, &r));
  EXPECT_EQ(r.leg, KvLeg::kDecode);
  EXPECT_EQ(r.peer_address, "127.0.10.1:5601");
}

TEST(SimDialectCheck, MoriioReadNeedsBlocksWriteDoesNot) {
  const json params{{"do_remote_prefill", true},        {"transfer_id", "tx"},
                    {"remote_host", "127.0.10.1"},         {"remote_handshake_port", 6301},
                    {"remote_notify_port", 61005}};
  KvRequest r;
  auto e = check(node_of(Connector::kMoriio, Role::kDecode, TransferMode::kRead),
                 json{{"kv_transfer_params", params}}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->reason, "missing_remote_block_ids");
  KvRequest w;
  ASSERT_FALSE(check(node_of(Connector::kMoriio, Role::kDecode, TransferMode::kWrite),
                     json{{"kv_transfer_params", params}}, &w));
  EXPECT_EQ(w.transfer_id, "tx");
  EXPECT_EQ(w.peer_address, "host:127.0.10.1,handshake:6301,notify:61005");
  e = check(node_of(Connector::kMoriio, Role::kDecode, TransferMode::kWrite),
            json{{"kv_transfer_params", {{"do_remote_prefill", true}}}}, &w);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->reason, "missing_transfer_id");
}

TEST(SimDialectCheck, P2pNcclLegFromRoleAndAddressesFromTheRequestId) {
  const std::string id = "x___prefill_addr_127.0.10.1:21001___decode_addr_127.0.10.2:21002_abc";
  KvRequest r;
  ASSERT_FALSE(check(node_of(Connector::kP2pNccl, Role::kDecode), json::object(), &r, id));
  EXPECT_EQ(r.leg, KvLeg::kDecode);
  EXPECT_EQ(r.peer_address, "127.0.10.1:21001");
  ASSERT_FALSE(check(node_of(Connector::kP2pNccl, Role::kPrefill), json::object(), &r, id));
  EXPECT_EQ(r.leg, KvLeg::kPrefill);
  EXPECT_EQ(r.peer_address, "127.0.10.2:21002");
  auto e = check(node_of(Connector::kP2pNccl, Role::kPrefill), json::object(), &r, "plain-id");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->reason, "bad_request_id");
}

TEST(SimDialectCheck, SglangDecodeFindsItsPrefillInTheBody) {
  KvRequest r;
  ASSERT_FALSE(check(node_of(Connector::kSglang, Role::kDecode),
                     json{{"bootstrap_host", "[::1]"}, {"bootstrap_port", 8998}}, &r));
  EXPECT_EQ(r.leg, KvLeg::kDecode);
  EXPECT_EQ(r.peer_address, "[::1]:8998");
  KvRequest p;
  ASSERT_FALSE(check(node_of(Connector::kSglang, Role::kPrefill),
                     json{{"bootstrap_host", "127.0.10.1"}, {"bootstrap_port", 8998}}, &p));
  EXPECT_EQ(p.leg, KvLeg::kPrefill);
  EXPECT_EQ(p.peer_address, "");
}

TEST(SimDialectCheck, MooncakeDecodeNeedsItsBootstrapServer) {
  KvNodeIdentity node = node_of(Connector::kMooncake, Role::kDecode);
  json params{{"do_remote_prefill", true}, {"remote_engine_id", "e"}, {"transfer_id", "tx"}};
  KvRequest r;
  auto e = check(node, json{{"kv_transfer_params", params}}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->reason, "missing_remote_bootstrap_addr");
  params["remote_bootstrap_addr"] = "http://127.0.10.1:8998";
  ASSERT_FALSE(check(node, json{{"kv_transfer_params", params}}, &r));
  EXPECT_EQ(r.peer_address, "http://127.0.10.1:8998");
  EXPECT_EQ(r.transfer_id, "tx");
}

TEST(SimDialectAnswer, OnlyNixlAndMoriioPrefillsAnswerParams) {
  KvRequest leg;
  leg.leg = KvLeg::kPrefill;
  leg.dp_rank = 1;
  leg.transfer_id = "tx";
  KvNodeIdentity nixl = node_of(Connector::kNixl, Role::kPrefill);
  nixl.kv_port = 5600;
  json a = dialect_of(Connector::kNixl).prefill_answer(nixl, leg, "cmpl-rid-0", {7, 8});
  EXPECT_EQ(a["remote_port"], 5601);
  EXPECT_EQ(a["remote_engine_id"], "engine-x");
  EXPECT_EQ(a["remote_request_id"], "cmpl-rid-0");
  EXPECT_EQ(a["remote_block_ids"], json::array({7, 8}));
  for (TransferMode mode : {TransferMode::kRead, TransferMode::kWrite}) {
    KvNodeIdentity moriio = node_of(Connector::kMoriio, Role::kPrefill, mode);
    json m = dialect_of(Connector::kMoriio, mode).prefill_answer(moriio, leg, "i", {1});
    EXPECT_EQ(m["remote_engine_id"], "127.0.0.1:6301");
    EXPECT_EQ(m["transfer_id"], "tx");
  }
  for (Connector c : {Connector::kMooncake, Connector::kP2pNccl, Connector::kSglang}) {
    EXPECT_TRUE(dialect_of(c).prefill_answer(node_of(c, Role::kPrefill), leg, "i", {1}).is_null())
        << proto::to_string(c);
  }
}

TEST(SimDialectPorts, SideChannelRanges) {
  KvNodeIdentity node = node_of(Connector::kNixl, Role::kPrefill);
  node.dp_size = 3;
  node.tp_size = 2;
  EXPECT_EQ(side_port_count(dialect_of(Connector::kNixl), node), 3u);
  EXPECT_EQ(side_port_count(dialect_of(Connector::kMooncake), node), 6u);
  EXPECT_EQ(side_port_count(dialect_of(Connector::kP2pNccl), node), 1u);
  EXPECT_EQ(side_port_count(dialect_of(Connector::kSglang), node), 1u);
  const auto moriio = dialect_of(Connector::kMoriio, TransferMode::kRead).side_channel(node);
  ASSERT_EQ(moriio.size(), 2u);
  EXPECT_EQ(node.*moriio[0].base, node.handshake_port);
  EXPECT_EQ(node.*moriio[1].base, node.notify_port);
}

proto::Registration registration_of(const KvNodeIdentity& node, bool moves_kv,
                                    std::optional<uint16_t> bootstrap = std::nullopt) {
  SimRegistrationInputs in;
  in.node = &node;
  in.model = "m";
  in.moves_kv = moves_kv;
  in.bootstrap_port = bootstrap;
  proto::Registration reg;
  find_sim_dialect(node)->fill_registration(in, &reg);
  return reg;
}

TEST(SimDialectRegistration, EachDialectsFormat) {
  KvNodeIdentity moriio = node_of(Connector::kMoriio, Role::kPrefill, TransferMode::kWrite);
  proto::Registration reg = registration_of(moriio, true);
  EXPECT_EQ(reg.format, proto::RegistrationFormat::kMoriio);
  EXPECT_EQ(reg.transfer_mode, TransferMode::kWrite);
  ASSERT_TRUE(reg.moriio_zmq);
  EXPECT_EQ(reg.moriio_zmq->handshake_port, 6301);

  KvNodeIdentity p2p = node_of(Connector::kP2pNccl, Role::kDecode);
  p2p.kv_port = 21001;
  reg = registration_of(p2p, true);
  EXPECT_EQ(reg.format, proto::RegistrationFormat::kP2pNccl);
  EXPECT_EQ(reg.zmq_address, "127.0.0.1:21001");

  KvNodeIdentity mooncake = node_of(Connector::kMooncake, Role::kPrefill);
  mooncake.http_port = 8000;
  reg = registration_of(mooncake, false);
  EXPECT_EQ(reg.format, proto::RegistrationFormat::kPdrouter);
  EXPECT_EQ(reg.model, "m");
  EXPECT_EQ(reg.bootstrap_port, std::optional<uint16_t>(8000));
  EXPECT_EQ(registration_of(mooncake, false, 8998).bootstrap_port, std::optional<uint16_t>(8998));
  mooncake.role = Role::kDecode;
  EXPECT_FALSE(registration_of(mooncake, false).bootstrap_port);

  KvNodeIdentity sglang = node_of(Connector::kSglang, Role::kPrefill);
  sglang.kv_port = 7000;
  EXPECT_EQ(registration_of(sglang, true).bootstrap_port, std::optional<uint16_t>(7000));
  EXPECT_FALSE(registration_of(sglang, false).bootstrap_port);

  EXPECT_EQ(registration_of(node_of(Connector::kNixl, Role::kDecode), true).format,
            proto::RegistrationFormat::kPdrouter);
}

TEST(SimDialectPeer, ResolvedWithoutTheNetwork) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  KvBlocks blocks;
  proto::HostPort where;
  auto e = resolve_kv_peer(dialect_of(Connector::kNixl), blocks, deadline, &where);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->reason, "kv_peer_unreachable");
  blocks.peer_address = "127.0.0.1:5601";
  ASSERT_FALSE(resolve_kv_peer(dialect_of(Connector::kNixl), blocks, deadline, &where));
  EXPECT_EQ(where.to_string(), "127.0.0.1:5601");
  blocks.peer_address = "host:127.0.0.1,handshake:6301,notify:61005";
  ASSERT_FALSE(resolve_kv_peer(dialect_of(Connector::kMoriio, TransferMode::kRead), blocks,
                               deadline, &where));
  EXPECT_EQ(where.to_string(), "127.0.0.1:6301");
  blocks.peer_address = "not an address";
  EXPECT_TRUE(resolve_kv_peer(dialect_of(Connector::kSglang), blocks, deadline, &where));
  EXPECT_TRUE(resolve_kv_peer(dialect_of(Connector::kMooncake), blocks, deadline, &where));
}

}  // namespace
}  // namespace pdr::node::sim
