// Registry operations behind the admin API: add (new, over registered, conflicts, full), remove,
// and the operator drain that heartbeats, restarts, goodbyes and reloads must not clear.
#include <gtest/gtest.h>

#include "discovery/registry.h"

namespace pdr::discovery {
namespace {

using namespace std::chrono_literals;

const Clock::time_point t0 = Clock::time_point(std::chrono::hours(1000));

RegistryOptions opts() {
  RegistryOptions o;
  o.default_ttl = 5000ms;
  o.expired_retention = 10000ms;
  o.max_instances = 3;
  return o;
}

config::StaticInstance spec(std::string host, uint16_t port, proto::Role role = proto::Role::kDecode) {
  config::StaticInstance s;
  s.role = role;
  s.http_address = {std::move(host), port};
  s.connector = proto::Connector::kNixl;
  s.dp_size = 2;
  s.model = "m";
  return s;
}

proto::Registration heartbeat(std::string host, uint16_t port, uint64_t epoch = 0) {
  proto::Registration r;
  r.format = proto::RegistrationFormat::kPdrouter;
  r.role = proto::Role::kPrefill;
  r.http_address = {std::move(host), port};
  r.connector = proto::Connector::kNixl;
  r.epoch = epoch;
  return r;
}

const Instance& only(const RegistrySnapshotPtr& snap) {
  EXPECT_EQ(snap->instances.size(), 1u);
  return *snap->instances.at(0);
}

TEST(RegistryAdmin, AddedInstanceNeverExpiresAndKeepsItsDescriptionOverHeartbeats) {
  Registry reg(opts());
  AdminOutcome out = reg.add_admin(spec("127.0.10.1", 8000), t0);
  ASSERT_EQ(out.result, AdminResult::kCreated);
  EXPECT_EQ(out.instance->source, InstanceSource::kAdmin);
  EXPECT_EQ(out.instance->expires_at(), Clock::time_point::max());
  EXPECT_TRUE(reg.dirty());

  reg.upsert(heartbeat("127.0.10.1", 8000, 7), t0 + 1s);  // claims prefill
  const Instance& inst = only(reg.snapshot(t0 + 1s));
  EXPECT_EQ(inst.role, proto::Role::kDecode);  // the operator's word stands
  EXPECT_EQ(inst.dp_size, 2u);
  EXPECT_EQ(inst.epoch, 7u);
  EXPECT_EQ(inst.messages(), 1u);
  EXPECT_EQ(reg.expire_due(t0 + 1h).expired, 0u);
}

TEST(RegistryAdmin, AddOverStaticOrAdminConflicts) {
  Registry reg(opts());
  reg.replace_static({spec("127.0.10.1", 8000)}, t0);
  reg.add_admin(spec("127.0.10.2", 8000), t0);
  reg.snapshot(t0);

  AdminOutcome over_static = reg.add_admin(spec("127.0.10.1", 8000, proto::Role::kPrefill), t0);
  EXPECT_EQ(over_static.result, AdminResult::kConflict);
  EXPECT_NE(over_static.message.find("topology file"), std::string::npos) << over_static.message;
  EXPECT_EQ(over_static.instance->role, proto::Role::kDecode);
  AdminOutcome twice = reg.add_admin(spec("127.0.10.2", 8000), t0);
  EXPECT_EQ(twice.result, AdminResult::kConflict);
  EXPECT_FALSE(reg.dirty()) << "a refused add changes nothing";
}

TEST(RegistryAdmin, AddOverRegisteredTakesItOverKeepingLivenessAndDrain) {
  Registry reg(opts());
  auto hb = heartbeat("127.0.10.1", 8000, 3);
  hb.draining = true;
  reg.upsert(hb, t0);
  AdminOutcome out = reg.add_admin(spec("127.0.10.1", 8000), t0 + 1s);
  ASSERT_EQ(out.result, AdminResult::kReplaced);
  const Instance& inst = only(reg.snapshot(t0 + 1s));
  EXPECT_EQ(inst.source, InstanceSource::kAdmin);
  EXPECT_EQ(inst.role, proto::Role::kDecode);
  EXPECT_EQ(inst.epoch, 3u);
  EXPECT_EQ(inst.first_seen, t0);
  EXPECT_EQ(inst.state, InstanceState::kDraining);  // the node still says it drains
  EXPECT_EQ(reg.expire_due(t0 + 1h).expired, 0u) << "no longer expires";
}

TEST(RegistryAdmin, AddIntoAFullRegistryIsRefused) {
  Registry reg(opts());
  for (uint16_t port : {8001, 8002, 8003}) reg.upsert(heartbeat("127.0.10.1", port), t0);
  EXPECT_EQ(reg.add_admin(spec("127.0.10.9", 8000), t0).result, AdminResult::kRejectedFull);
  reg.expire_due(t0 + 6s);  // all three expire: evictable
  EXPECT_EQ(reg.add_admin(spec("127.0.10.9", 8000), t0 + 6s).result, AdminResult::kCreated);
  EXPECT_EQ(reg.size(), 3u);
}

TEST(RegistryAdmin, RemoveAdminAndRegisteredButNotStatic) {
  Registry reg(opts());
  reg.replace_static({spec("127.0.10.1", 8000)}, t0);
  reg.add_admin(spec("127.0.10.2", 8000), t0);
  reg.upsert(heartbeat("127.0.10.3", 8000), t0);
  reg.snapshot(t0);

  AdminOutcome refused = reg.remove("127.0.10.1:8000");
  EXPECT_EQ(refused.result, AdminResult::kConflict);
  EXPECT_FALSE(reg.dirty());
  AdminOutcome removed = reg.remove("127.0.10.2:8000");
  EXPECT_EQ(removed.result, AdminResult::kOk);
  EXPECT_EQ(removed.instance->key, "127.0.10.2:8000");
  EXPECT_EQ(reg.remove("127.0.10.3:8000").result, AdminResult::kOk);
  EXPECT_EQ(reg.remove("127.0.10.3:8000").result, AdminResult::kNotFound);
  EXPECT_TRUE(reg.dirty());
  EXPECT_EQ(reg.snapshot(t0)->instances.size(), 1u);
  // A removed registered node that still runs is back with its next heartbeat.
  EXPECT_EQ(reg.upsert(heartbeat("127.0.10.3", 8000), t0 + 1s).result, UpsertResult::kAdded);
}

TEST(RegistryAdmin, OperatorDrainSurvivesHeartbeatsRestartsAndReloads) {
  Registry reg(opts());
  reg.upsert(heartbeat("127.0.10.1", 8000, 1), t0);
  reg.replace_static({spec("127.0.10.2", 8000)}, t0);
  reg.snapshot(t0);

  AdminOutcome out = reg.set_operator_drain("127.0.10.1:8000", true);
  ASSERT_EQ(out.result, AdminResult::kOk);
  EXPECT_EQ(out.instance->state, InstanceState::kDraining);
  EXPECT_TRUE(out.instance->operator_drain);
  EXPECT_TRUE(reg.dirty());
  reg.snapshot(t0);

  reg.upsert(heartbeat("127.0.10.1", 8000, 1), t0 + 1s);  // says draining: false
  EXPECT_FALSE(reg.dirty()) << "a heartbeat that repeats itself changes nothing";
  reg.upsert(heartbeat("127.0.10.1", 8000, 2), t0 + 2s);  // restart
  auto snap = reg.snapshot(t0 + 2s);
  EXPECT_EQ(snap->find("127.0.10.1:8000")->state, InstanceState::kDraining);
  EXPECT_EQ(snap->find("127.0.10.1:8000")->restarts, 1u);
  EXPECT_EQ(snap->count(proto::Role::kPrefill, InstanceState::kDraining), 1u);

  // Static: the drain outlives a reload of the same file.
  EXPECT_EQ(reg.set_operator_drain("127.0.10.2:8000", true).result, AdminResult::kOk);
  reg.replace_static({spec("127.0.10.2", 8000)}, t0 + 3s);
  EXPECT_EQ(reg.snapshot(t0 + 3s)->find("127.0.10.2:8000")->state, InstanceState::kDraining);

  EXPECT_EQ(reg.set_operator_drain("127.0.10.9:8000", true).result, AdminResult::kNotFound);
}

TEST(RegistryAdmin, UndrainRestoresWhatTheNodeSays) {
  Registry reg(opts());
  auto hb = heartbeat("127.0.10.1", 8000);
  reg.upsert(hb, t0);
  reg.set_operator_drain("127.0.10.1:8000", true);
  hb.draining = true;
  reg.upsert(hb, t0 + 1s);  // the node drains itself too
  EXPECT_EQ(reg.set_operator_drain("127.0.10.1:8000", false).instance->state, InstanceState::kDraining);
  hb.draining = false;
  reg.upsert(hb, t0 + 2s);
  EXPECT_EQ(only(reg.snapshot(t0 + 2s)).state, InstanceState::kUp);
  // Idempotent: undraining an undrained instance is OK and publishes nothing.
  EXPECT_EQ(reg.set_operator_drain("127.0.10.1:8000", false).result, AdminResult::kOk);
  EXPECT_FALSE(reg.dirty());
}

TEST(RegistryAdmin, DrainedInstanceThatExpiresComesBackDraining) {
  Registry reg(opts());
  reg.upsert(heartbeat("127.0.10.1", 8000), t0);
  reg.set_operator_drain("127.0.10.1:8000", true);
  EXPECT_EQ(reg.expire_due(t0 + 6s).expired, 1u);
  EXPECT_EQ(only(reg.snapshot(t0 + 6s)).state, InstanceState::kExpired);
  EXPECT_EQ(reg.upsert(heartbeat("127.0.10.1", 8000), t0 + 7s).result, UpsertResult::kRevived);
  EXPECT_EQ(only(reg.snapshot(t0 + 7s)).state, InstanceState::kDraining);
}

}  // namespace
}  // namespace pdr::discovery
